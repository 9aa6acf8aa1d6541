"""A run's options as a file: every run writes the options that re-run it to ``RUN/options.json``,
and ``attnlab train FAMILY --config FILE`` (:func:`attnlab.train` ``config=``) reads such a file, a
YAML or JSON file of options, or a run folder; options given beside it override it.

The file is a mapping of option names (those of ``attnlab.train_options(family)``) to values::

    family: gpt            # optional; checked when given
    data: shakespeare
    preset: shakespeare-cpu
    max_iters: 2000
    lr: 0.005

``{"options": {...}}`` (what runs write) and a checkpoint's ``config.json`` (its ``model`` and
``train`` sections) are read too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import OptionError

OPTIONS_FILE = "options.json"
NOT_REPLAYED = ("out", "resume", "data_dir")  # where a run is, not what it is


def read_options(
    source: str | Path, family: str, family_models: tuple[str, ...] = (), known: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The options (``data`` among them) that ``source`` holds for a ``family`` run: a YAML or
    JSON file, or a run folder (its options.json, else its checkpoint's config.json, whose
    fields among ``known``, the family's options, are read)."""
    path = Path(source)
    if path.is_dir():
        found = next(
            (p for p in (path / OPTIONS_FILE, path / "last" / "config.json", path / "config.json") if p.is_file()),
            None,
        )
        if found is None:
            raise OptionError(f"--config {path}: a folder without {OPTIONS_FILE} or config.json; give a run folder")
        path = found
    elif not path.is_file():
        raise OptionError(f"--config {path} does not exist; give a YAML or JSON file of options, or a run folder")
    data = _parse(path)
    if not isinstance(data, dict):
        raise OptionError(f"--config {path}: expected a mapping of option names to values, got {type(data).__name__}")
    named = data.get("family")
    if named is not None and named != family:
        raise OptionError(f"--config {path} is for attnlab train {named}, not {family}")
    if "model_type" in data or "model" in data:  # a checkpoint's config.json
        if family_models and data.get("model_type") not in family_models:
            raise OptionError(f"--config {path} holds a {data.get('model_type')} model, not a {family} model")
        options = {**_section(data, "model", path), **_section(data, "train", path)}
        options = {k: v for k, v in options.items() if k in known}  # (widths, labels: not options)
        if data.get("data_spec") is not None:
            options["data"] = data["data_spec"]
        return options
    options = data.get("options", {k: v for k, v in data.items() if k not in ("family", "attnlab")})
    return dict(_section({"options": options}, "options", path))


def _parse(path: Path) -> Any:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise OptionError(
                f"--config {path}: reading YAML needs PyYAML (pip install pyyaml), or give JSON"
            ) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise OptionError(f"--config {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        kind = "JSON" if path.suffix.lower() == ".json" else "JSON (or YAML named .yaml)"
        raise OptionError(f"--config {path} is not valid {kind}: {e.msg} at line {e.lineno}") from None


def _section(data: dict, key: str, path: Path) -> dict:
    part = data.get(key, {})
    if not isinstance(part, dict):
        raise OptionError(f"--config {path}: {key!r} must be a mapping of option names to values")
    return part


def write_options(out: str | Path, family: str, options: dict[str, Any]) -> Path:
    """Write ``RUN/options.json``: what re-runs this run (``--config RUN``), atomically."""
    from . import __version__

    from .outputs import atomic_write_text

    kept = {k: v for k, v in options.items() if k not in NOT_REPLAYED}
    text = json.dumps({"family": family, "attnlab": __version__, "options": kept}, indent=1) + "\n"
    return atomic_write_text(Path(out) / OPTIONS_FILE, text)
