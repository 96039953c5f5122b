"""The control plane: the API, the store, and the production shell around the owner."""
