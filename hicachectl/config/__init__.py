"""The user's configuration: the catalogue of every variable (schema), a host's typed Deployment, the inventory
(Ansible's loader, Vault), secrets, where hicachectl's files are (paths), the L3 namespace and the KV sizing. The
bottom layer of the core but formats: imports nothing of hicachectl above it."""
