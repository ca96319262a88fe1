"""Kubernetes wire formats and object semantics, with no policy in them: the
AdmissionReview envelope and its replies, quantities, JSON Patch and JSON Pointer, where
each kind keeps its pod templates, and a pod's effective requests."""
