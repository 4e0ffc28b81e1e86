"""`joulesched autoscaler-provider`: cluster-autoscaler's externalgrpc cloud provider
(:mod:`joulesched.live.autoscaler`) beside the node power controller it drives.

Its options are ``node-power``'s (actuator, addresses, credentials, Lease, status endpoint: one definition, taken
from that command's signature) plus the provider's own: the node groups file, the gRPC address and the mTLS
files.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from joulesched.pipelines.cli.live import NODE_POWER_AROUND, node_power

log = logging.getLogger("joulesched.autoscaler")

_OWN = {
    "config": (Annotated[Path, typer.Option("--config", help="Node groups and pricing (YAML; docs/node-power.md).")],
               inspect.Parameter.empty),
    "grpc_listen": (Annotated[str, typer.Option("--grpc-listen", help="HOST:PORT the autoscaler calls (plaintext "
                                                "only on loopback; elsewhere give the three TLS files).")],
                    "127.0.0.1:8086"),
    "tls_cert": (Annotated[Optional[Path], typer.Option("--tls-cert", help="The server's certificate (PEM).")], None),
    "tls_key": (Annotated[Optional[Path], typer.Option("--tls-key", help="The server's private key (PEM).")], None),
    "client_ca": (Annotated[Optional[Path], typer.Option("--client-ca", help="CA the autoscaler's client "
                                                         "certificate must chain to (mTLS).")], None),
}


def _provider(config: Path, grpc_listen: str, tls_cert: Path | None, tls_key: Path | None,
              client_ca: Path | None) -> Any:
    """Check the provider's inputs now (exit 2 on a bad one) and return ``daemon -> context manager``."""
    from joulesched.core.errors import UsageError
    from joulesched.core.net import is_loopback, parse_listen
    from joulesched.live.autoscaler import TLSFiles, load_protos, load_provider_config

    cfg = load_provider_config(config)
    host, _ = parse_listen(grpc_listen, "--grpc-listen")
    tls_files = (tls_cert, tls_key, client_ca)
    if any(tls_files) and not all(tls_files):
        raise UsageError("--tls-cert, --tls-key and --client-ca go together (mTLS)")
    tls = TLSFiles(str(tls_cert), str(tls_key), str(client_ca)) if all(tls_files) else None
    if tls is None and not is_loopback(host):
        raise UsageError(f"--grpc-listen {grpc_listen}: plaintext gRPC only on loopback; give --tls-cert, "
                         "--tls-key and --client-ca to serve the autoscaler over mTLS")
    if tls is not None:
        tls.credentials()  # the files are readable PEM: named now, not when the autoscaler first calls
    load_protos()  # grpcio and grpcio-tools present: a missing one is named before anything starts

    @contextlib.contextmanager
    def around(daemon: Any):
        from joulesched.live.autoscaler import AutoscalerProvider, ProviderServer, describe

        provider = AutoscalerProvider(daemon.controller, cfg)
        server = ProviderServer(provider, grpc_listen, tls).start()
        log.info("autoscaler provider on %s (%s), groups %s", grpc_listen, "mTLS" if tls else "plaintext",
                 ", ".join(g.id for g in cfg.groups))
        try:
            yield provider
        finally:
            server.stop()
            log.info("autoscaler provider stopped: %s", describe(provider))

    return around


def autoscaler_provider(**options: Any) -> None:
    """Serve cluster-autoscaler's externalgrpc CloudProvider: node groups grow by waking their sleeping nodes
    and shrink by putting drained nodes to sleep, until SIGTERM."""
    from joulesched.pipelines.cli.common import errors

    own = {k: options.pop(k) for k in _OWN}
    with errors():
        around = _provider(**own)
    token = NODE_POWER_AROUND.set(around)
    try:
        node_power(**options)
    finally:
        NODE_POWER_AROUND.reset(token)


def _signature() -> inspect.Signature:
    base = inspect.signature(node_power, eval_str=True)
    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=ann)
              for name, (ann, default) in _OWN.items()]
    rest = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in base.parameters.values()]
    return base.replace(parameters=params + rest)


autoscaler_provider.__signature__ = _signature()  # type: ignore[attr-defined]
