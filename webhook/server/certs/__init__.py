"""The serving certificate: TLS set up and reloaded from files, client certificates
checked, and the self-managed certificates kept in a Secret."""
