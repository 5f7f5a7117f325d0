"""rollout: plan and apply changes across the GPU nodes of Kubernetes clusters."""

__version__ = "0.1.0"
