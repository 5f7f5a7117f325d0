"""The Kubernetes client imports an API group's class on first use, never all of them.

kubernetes imports an API module with every model it names (CoreV1Api 0.4 s, AppsV1Api
0.3 s here), so `plan -i` imports only what it calls, and starts that import beside the SSH
probe (`import_in_background`). Checked in a fresh interpreter; never timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

API_MODULES = ("core_v1_api", "policy_v1_api", "custom_objects_api", "apps_v1_api")


def api_modules_after(steps: str) -> dict[str, list[str]]:
    """Which API modules are imported after constructing a client, and after `steps`."""
    script = textwrap.dedent(
        f"""
        import json, sys, threading
        from rollout.transports.kube import KubeClient

        def loaded():
            return sorted(m.rsplit(".", 1)[1] for m in sys.modules
                          if m.startswith("kubernetes.client.api.")
                          and m.rsplit(".", 1)[1] in {API_MODULES!r})

        kube = KubeClient.from_url("http://127.0.0.1:9")
        constructed = loaded()
        {steps}
        print(json.dumps({{"constructed": constructed, "after": loaded()}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    found: dict[str, list[str]] = json.loads(result.stdout)
    return found


def test_a_new_client_has_imported_no_api_group() -> None:
    found = api_modules_after("kube._policy")
    assert found["constructed"] == []
    assert found["after"] == ["policy_v1_api"]


def test_the_background_import_loads_what_plan_reads_and_no_more() -> None:
    steps = (
        "kube.import_in_background(); "
        "[t.join() for t in threading.enumerate() if t.name == 'kube-import']"
    )
    found = api_modules_after(steps)
    assert found["after"] == ["core_v1_api", "custom_objects_api", "policy_v1_api"]
