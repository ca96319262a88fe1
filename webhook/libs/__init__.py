"""One module per outside library, so the rest of the code reads in the product's own
terms: ``kube`` (the kubernetes client), ``certs`` (cryptography), ``logs`` (structured
JSON logs)."""
