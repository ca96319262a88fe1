"""No GPU without a charge: the routes to a GPU that skip the GPU request, closed.

Quota counts the GPUs a pod asks for (device-plugin resources, DRA claims). On a node
with NVIDIA's container runtime a container can take GPUs without asking, and this
package closes each way for the pods of a tenant's namespaces (``gpuRoutes``, per
tenant; the facts and their sources: docs/security.md):

- ``NVIDIA_VISIBLE_DEVICES``: the runtime hands a container the GPUs the variable names
  (``all`` is the default of CUDA images). A container given no GPU gets ``void`` (an
  explicit ``env`` entry, which wins over ``envFrom`` in the kubelet and comes after the
  image's value, and the runtime reads the last); a container given GPUs by the device
  plugin loses its own entry, which would come after the device plugin's and replace it.
  ``deny`` refuses a container that sets the variable; ``allow`` leaves it alone.
- privilege (``privileged``, or ``SYS_ADMIN``, which the runtime reads as privileged) and
  hostPath volumes of ``/dev``: refused in a pod that can reach GPU nodes.
- ``spec.nodeName`` at creation: the scheduler is skipped and the kubelet checks only
  NoExecute taints, so the GPU nodes' NoSchedule taint no longer keeps the pod off.
  Refused unless the webhook's node watch knows the node to carry no GPU.
- ephemeral containers (``kubectl debug``): checked as containers are, when added.
- PriorityClasses: the classes a tenant may name and a ceiling on their value, so that
  no tenant's pod outranks (and preempts) another tenant's in-quota pod.
- DRA device taints: a GPU claim's request may not tolerate them (the driver taints
  GPUs it finds unhealthy).

Every change is made only when missing, so mutating the output again adds nothing.

The modules, top to bottom (each imports only from those below it; the import-linter
contract in pyproject.toml holds them to it):

- ``recheck``: the validating webhook's look at the final Pod or claim, to enforce only.
- ``pods``: a tenant's Pod at creation, every route checked; ``ephemeral``: the
  containers ``kubectl debug`` adds; ``held``: the routes a running pod holds (audit).
- ``devicetaints``: DRA claims' tolerations of device taints; ``priority``: the
  PriorityClass a pod names, or its tenant's default; ``containers``: one container's
  routes (the variable, privilege) and the pod's ``/dev`` mounts.
- ``rules``: the rules these checks report and the tenant's route rules of a target;
  ``sights``: what the webhook's watches know (nodes with GPUs, PriorityClasses).
"""
