"""What the policy asks of the API server: the webhook configurations that send it only
what the webhook acts on (:mod:`.webhooks`, from :mod:`.rules` and :mod:`.cel`), and how
the configurations the API server holds differ from them (:mod:`.drift`). Pure: the
command ``gpu-webhook manifests`` prints them, the leader compares and writes them."""
