"""The API server as a second executor of the policy's stateless rules: those rules
compiled into MutatingAdmissionPolicies and ValidatingAdmissionPolicies
(:mod:`.policies`, from the CEL of :mod:`.cel`), for ``gpu-webhook manifests
--admission-mode`` and the leader, which keeps them in step with the policy served.
Pure: nothing here talks to the cluster."""
