"""Plan files the suites write: a time-slicing change, in the plan file's own YAML; and the
device plugin's config of a profile, as a ConfigMap holds it."""

from __future__ import annotations


def time_slicing_plan(
    *, name: str, targets: str, profile: str, replicas: int = 4, policy: str = ""
) -> str:
    """A plan whose one change publishes `profile`, each GPU shared `replicas` ways.

    `targets` and `policy` are YAML as the plan file spells them (`policy` whole lines).
    """
    return f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: {name}}}
targets: {targets}
changes:
  - time-slicing:
      profile: {profile}
      config:
        version: v1
        sharing:
          timeSlicing:
            resources:
              - name: nvidia.com/gpu
                replicas: {replicas}
{policy}"""


def sharing_config(replicas: int) -> str:
    """The device plugin's config that shares each nvidia.com/gpu `replicas` ways."""
    return (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        f"    - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
