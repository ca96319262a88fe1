"""The commands of ``gpu-webhook``, a module per family: each adds its commands to the
parser (``add_*``) and runs them. ``webhook.cli`` puts the parser together and runs the
command asked for."""
