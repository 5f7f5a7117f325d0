"""Transports: the only modules that talk to the outside world (processes, SSH, Kubernetes)."""
