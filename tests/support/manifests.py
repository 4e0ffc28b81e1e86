"""Reading deploy/kubernetes manifests in tests: every document of a file, one of a kind, schema validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def manifest_docs(name: str) -> list[dict]:
    """The non-empty documents of ``deploy/kubernetes/<name>``."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def only(docs: list[dict], kind: str, namespace: str | None = None) -> dict:
    """The one document of ``kind`` (in ``namespace`` when given; cluster-scoped ones match any)."""
    (d,) = [d for d in docs if d["kind"] == kind
            and (namespace is None or d["metadata"].get("namespace", namespace) == namespace)]
    return d


def validate_strict(docs: list[dict], version: str = "1.30.0") -> None:
    """kubernetes-validate's bundled schemas, offline, strict (unknown fields fail); skips without it."""
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (make test)")
    for doc in docs:
        kv.validate(doc, version, strict=True)
