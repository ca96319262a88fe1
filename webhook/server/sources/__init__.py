"""Where the served policy comes from: a file (a ConfigMap mount) reloaded when it
changes, or a GPUPolicy object watched in the cluster."""
