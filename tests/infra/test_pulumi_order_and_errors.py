"""The Pulumi program's order and errors: the aws master is created after its role's permission, and a bad stack
config is reported as a list of problems, without a traceback."""

from __future__ import annotations


import pytest

pytest.importorskip("pulumi", reason="infra extra not installed: pip install -e '.[infra]'")
import pulumi  # noqa: E402
from pulumi.runtime import mocks  # noqa: E402

from tests.infra.pulumi_harness import run_main, stack_config  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pulumi_aws deprecation notices
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBn1 user@example"


def _dependencies(monkeypatch) -> dict[str, set[str]]:
    """resource name -> the names of the resources its registration waits for (explicit and through inputs), as
    the engine gets them: the mocks' monitor sees every RegisterResource request."""
    deps: dict[str, set[str]] = {}
    orig = mocks.MockMonitor.RegisterResource

    def register(self, request):
        deps[request.name] = {urn.rsplit("::", 1)[-1] for urn in request.dependencies}
        return orig(self, request)

    monkeypatch.setattr(mocks.MockMonitor, "RegisterResource", register)
    return deps


def test_the_aws_master_is_created_after_the_permission_its_first_boot_uses(monkeypatch):
    """The master's first boot reads the CA key through its instance role (fetch-ca-key, before kubeadm init):
    the RolePolicy granting that must exist first. Before, only the parameter and the instance profile were
    ordered before the instance; the policy was created alongside it, in any order."""
    pytest.importorskip("pulumi_aws", reason="pulumi-aws not installed (pip install -e '.[infra-aws]')")
    deps = _dependencies(monkeypatch)
    run_main(stack_config("aws", sshPublicKey=KEY, sshCidr="203.0.113.7/32"))
    assert {"joulesched-ca-key", "joulesched-master-ca-key", "joulesched-master-profile"} <= \
        deps["joulesched-joulesched-master"]
    assert "joulesched-master-ca-key" not in deps["joulesched-joulesched-worker-0"]  # workers read nothing


def test_a_bad_stack_config_is_a_run_error_listing_every_problem():
    """Pulumi prints a RunError's message alone; any other exception as "Program failed with an unhandled
    exception" with the program's traceback. Before, the config's problems came inside that report."""
    from joulesched.infra.config import InfraConfigError

    with pytest.raises(pulumi.RunError) as e:
        run_main(stack_config("cluster", image="", powerExporterPort="80"))
    assert isinstance(e.value, InfraConfigError)  # still the config's own error, for callers that catch that
    assert str(e.value).startswith("invalid stack configuration:")
    assert "joulesched:image is required" in str(e.value) and "powerExporterPort" in str(e.value)
