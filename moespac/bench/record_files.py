"""Result records on disk: validated against result.schema.json, written atomically, failures kept apart.

A run writing RESULT.json either leaves a valid, complete record there (and removes a stale
RESULT.failure.json) or leaves RESULT.failure.json beside it (the error's last line and the config).
`load_valid_record` is how a pipeline decides whether to rerun: it returns None, logging why, for a
missing, truncated, invalid, incomplete, failed or other-config record, never a half-trusted dict.
"""

from __future__ import annotations

import functools
import json
import logging
import traceback
from pathlib import Path

from moespac.atomic import write_json
from moespac.errors import MoespacError
from moespac.hashing import canonical

log = logging.getLogger(__name__)

SCHEMA_PATH = Path(__file__).with_name("result.schema.json")


@functools.lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def failure_path(path) -> Path:
    """RESULT.json -> RESULT.failure.json (beside it)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.failure{path.suffix or '.json'}")


def read_record(path) -> dict:
    """Parse a record file; MoespacError when it is missing, truncated or not a JSON object."""
    path = Path(path)
    if not path.is_file():
        raise MoespacError(f"record {path}: no such file")
    try:
        record = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MoespacError(f"record {path}: not valid JSON, truncated or corrupt ({e})") from None
    if not isinstance(record, dict):
        raise MoespacError(f"record {path}: not a JSON object")
    return record


def validate_record(source) -> dict:
    """Validate a record (dict or file path) against the schema and for completeness; returns the record."""
    record = source if isinstance(source, dict) else read_record(source)
    where = "record" if isinstance(source, dict) else f"record {source}"
    errors = sorted(_validator().iter_errors(record),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        e = errors[0]
        at = "/".join(map(str, e.absolute_path)) or "(top)"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise MoespacError(f"{where}: schema violation at {at}: {e.message}{more}")
    check_complete(record, where)
    return record


def check_complete(record: dict, where: str = "record") -> None:
    """A bench record accounts for every prompt: each one ran (first turn) or was skipped; counts agree."""
    if record.get("kind") != "bench":
        return
    counts, requests, skipped = record["counts"], record["requests"], record["skipped"]
    if counts["requests"] != len(requests) or record["metrics"]["requests"] != len(requests):
        raise MoespacError(f"{where}: partial: counts say {counts['requests']} requests, "
                           f"the record holds {len(requests)}")
    if counts["skipped"] != len(skipped):
        raise MoespacError(f"{where}: partial: counts say {counts['skipped']} skipped, the record lists {len(skipped)}")
    firsts = {r["prompt_id"] for r in requests if r["turn"] == 1} | {s["id"] for s in skipped if "#" not in s["id"]}
    if len(firsts) != counts["prompts"]:
        raise MoespacError(f"{where}: partial: {len(firsts)} of {counts['prompts']} prompts ran or were skipped")
    calls = {c["call"] for c in record["calls"]}
    if any(r["call"] not in calls for r in requests):
        raise MoespacError(f"{where}: partial: a request names an engine call the record lacks")


def write_result(path, record: dict) -> None:
    """Validate, write atomically, then drop a stale failure record beside it (every command's result records go
    through here, so each kind is validated on write)."""
    plain = canonical(record)  # what json will hold: numpy -> lists, tuples -> lists
    validate_record(plain)
    write_json(path, plain)
    failure_path(path).unlink(missing_ok=True)


def write_failure(path, kind: str, timing: str, config: dict, error: BaseException) -> Path:
    """Write RESULT.failure.json beside `path` (atomically): the error and the config that failed."""
    from moespac.record import make_record

    last = traceback.format_exception_only(type(error), error)[-1].strip()
    record = make_record("failure", timing, canonical(config), {}, failed_kind=kind,
                         error=dict(type=type(error).__name__, message=str(error) or last, last_line=last))
    out = failure_path(path)
    write_json(out, record)  # not validated: it is written while another error unwinds, which must not be masked
    return out


def load_valid_record(path, config_hash: str | None = None) -> dict | None:
    """The record at `path` if it is present, complete, valid and (given config_hash) of that config; else None.

    A failure record beside it means the latest attempt failed: None as well, so the run is redone.
    """
    path = Path(path)
    if failure_path(path).exists():
        return _stale(path, f"the last run failed (see {failure_path(path).name})")
    if not path.exists():
        return _stale(path, "missing")
    try:
        record = validate_record(path)
    except MoespacError as e:
        return _stale(path, str(e))
    if record["kind"] == "failure":
        return _stale(path, "a failure record")
    if config_hash is not None and record["config_hash"] != config_hash:
        return _stale(path, f"config hash {record['config_hash']}, this run is {config_hash}")
    return record


def _stale(path: Path, reason: str) -> None:
    log.warning("record %s not usable (%s); rerun", path, reason)
    return None
