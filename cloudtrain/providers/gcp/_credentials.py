"""Offline: would ``google.auth.default()`` find credentials, and is there a project?

Looks where google-auth looks first, without importing it or asking the metadata server:
``GOOGLE_APPLICATION_CREDENTIALS``, then gcloud's application-default credentials file
(``CLOUDSDK_CONFIG`` or ``~/.config/gcloud``). The project is the ``project`` option,
``CLOUDSDK_CORE_PROJECT``/``GOOGLE_CLOUD_PROJECT``, the credentials file's own
(``project_id``, ``quota_project_id``) or gcloud's active configuration.
"""

from __future__ import annotations

import configparser
import json
import os
from pathlib import Path
from typing import Any

from cloudtrain.provision.credentials import Presence

FIX = "gcloud auth application-default login or GOOGLE_APPLICATION_CREDENTIALS"
PROJECT_ENVS = ("CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT")


def _config_dir() -> Path:
    return Path(os.environ.get("CLOUDSDK_CONFIG") or Path.home() / ".config" / "gcloud")


def _file() -> tuple[Path | None, str]:
    named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if named:
        path = Path(named)
        return (path, "GOOGLE_APPLICATION_CREDENTIALS") if path.is_file() else (None, named)
    adc = _config_dir() / "application_default_credentials.json"
    return (adc, "gcloud's application-default credentials") if adc.is_file() else (None, "")


def _gcloud_project() -> str | None:
    config = _config_dir()
    try:
        active = (config / "active_config").read_text().strip() or "default"
    except OSError:
        active = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(config / "configurations" / f"config_{active}")
        return parser.get("core", "project", fallback=None)
    except configparser.Error:
        return None


def present(options: dict[str, Any]) -> Presence:
    path, source = _file()
    if path is None:
        missing = f"GOOGLE_APPLICATION_CREDENTIALS={source!r} is not a file; " if source else ""
        return Presence("gcp", False, fix=missing + FIX)
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return Presence("gcp", False, fix=f"{path} does not parse ({exc}); {FIX}")
    info = info if isinstance(info, dict) else {}
    project = (
        options.get("project")
        or next((os.environ[e] for e in PROJECT_ENVS if os.environ.get(e)), None)
        or info.get("project_id")
        or info.get("quota_project_id")
        or _gcloud_project()
    )
    if not project:
        return Presence(
            "gcp", False, fix="no project: --project, CLOUDSDK_CORE_PROJECT or gcloud config "
            "set project"
        )  # fmt: skip
    return Presence("gcp", True, f"{source}, project {project}")
