"""HTTP: the admission app the API server calls, the connections it accepts, the
mutating decisions it reuses and the GPUPolicy validating hook."""
