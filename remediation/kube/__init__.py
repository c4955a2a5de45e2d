"""The Kubernetes adapter, in its parts: ``adapter`` (the verbs over the official client, the only
module that imports ``kubernetes``), ``views`` (the typed results and object views they answer),
``errors`` (what they raise instead of the client's exceptions) and ``rbac`` (what the shipped RBAC
grants, to explain a refusal)."""
