"""What one replica does for the whole cluster while it holds the leader Lease: the
GPUQuota status objects and the periodic audit's PolicyReports."""
