"""Hugging Face Hub names wherever plm takes a run: `bert-base-uncased`, `org/name`, `org/name@REVISION`.

A name that is not a local path is a Hub model id. Its files (config.json, the weights, the tokenizer
files: nothing else) come through huggingface_hub's cache (`snapshot_download`, which honours HF_HUB_CACHE,
HF_HOME and HF_HUB_OFFLINE), and are converted once, by plmcli.interop.hf's import, into the run directory
`runs/hub/<org>--<name>[@REVISION]` (under PLM_RUNS): every later use reads that run, with no download and no
conversion. The conversion is written into a temp directory beside it and renamed into place, so an
interrupted one never looks complete. `plm export --format hf --push-to-hub REPO` uploads the other way.

huggingface_hub is imported only when the Hub is used: `plm --help` and local runs never load it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from plmcli.errors import PlmError

HUB_DIR = "hub"
"""Where converted Hub models live, under the runs directory."""

ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?(@[^\s@]+)?")
"""A Hub model id, optionally pinned to a branch, tag or commit with @REVISION."""

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
         "vocab.json", "merges.txt", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors")
"""What the import reads (plmcli.interop.hf), top level only: safetensors weights when the repo has them."""

BIN_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin")
"""Fetched only when the repo has no safetensors weights."""

NAME_HINT = "check the name (e.g. bert-base-uncased, org/name, org/name@REVISION), or pass a local directory"


def is_hub_name(name: str | None) -> bool:
    """Whether `name` is taken as a Hub id: it looks like one and nothing local answers to it (a path that
    exists, or one whose first folder does: `runs/typo` stays a local path and gets the local error)."""
    if not name or not ID.fullmatch(name) or Path(name).exists():
        return False
    return "/" not in name or not Path(name.split("/")[0]).is_dir()


def split_name(name: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of `org/name@REVISION`."""
    repo_id, _, revision = name.partition("@")
    return repo_id, revision or None


def hub_run_dir(name: str) -> Path:
    """runs/hub/<org>--<name>[@REVISION]: where `name` is converted (a revision's slashes become --)."""
    from plmcli.runs import runs_root

    repo_id, revision = split_name(name)
    folder = repo_id.replace("/", "--") + (f"@{revision.replace('/', '--')}" if revision else "")
    return runs_root() / HUB_DIR / folder


def local_run(run: str | None) -> str | None:
    """`run` itself, unless it is a Hub id: then the plm run it converts to, fetched and converted on first use."""
    if not is_hub_name(run):
        return run
    dest = hub_run_dir(run)
    if not (dest / "config.json").is_file():  # written last, by the rename: a complete conversion
        import_hub(run, None)
    return str(dest)


def import_hub(name: str, out: str | None = None, force: bool = False) -> dict:
    """`plm import NAME [--out RUN]`: fetch the Hub model `name` and convert it into `out` (default runs/hub/...).
    Returns plmcli.interop.hf.import_hf's report with "hub": {repo_id, revision, commit}, or, for the default
    directory already converted (and no `force`), {"out", "hub", "reused": True}."""
    from plmcli.data.outdir import check_writable
    from plmcli.interop.hf import import_hf

    dest = Path(out) if out else hub_run_dir(name)
    if out is None and (dest / "config.json").is_file() and not force:
        import json

        try:  # what the conversion recorded; a damaged config.json is the run reader's to report
            origin = json.loads((dest / "config.json").read_text(encoding="utf-8"))["imported_from"]["hub"]
        except (OSError, ValueError, KeyError, TypeError):
            origin = None
        return {"out": str(dest), "hub": origin, "reused": True}
    check_writable(dest)
    snapshot = fetch(name)
    repo_id, revision = split_name(name)
    origin = {"repo_id": repo_id, "revision": revision, "commit": snapshot.name}  # revision None: the default branch
    try:
        res = import_hf(str(snapshot), str(dest), force or out is None, origin={"hub": origin})
    except PlmError as e:  # the snapshot's path in the HF cache means nothing to the user: name the model
        raise PlmError(e.message.replace(str(snapshot), name), e.hint.replace(str(snapshot), name)) from e
    return {**res, "hub": origin}


# ---------------------------------------------------------------- huggingface_hub


def cache_dir() -> str | None:
    """The Hub cache as the environment names it now (huggingface_hub reads it once, at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    return os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def fetch(name: str) -> Path:
    """The snapshot directory of Hub model `name` in the local cache, downloaded into it if need be (only the
    files the import reads); a PlmError says why not (unknown id, revision, gated, no network)."""
    from huggingface_hub import snapshot_download

    repo_id, revision = split_name(name)

    def download(patterns) -> Path:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(patterns),
                                      cache_dir=cache_dir(), local_files_only=offline()))

    try:
        snapshot = download(FILES)
        if not any(snapshot.glob("model*.safetensors")):
            snapshot = download(BIN_FILES)
    except Exception as e:
        error = hub_error(e, name)
        if error is None:
            raise
        raise error from e
    return snapshot


def hub_error(e: Exception, name: str) -> PlmError | None:
    """huggingface_hub's exception as one line that says what to do; None for one it does not know."""
    from huggingface_hub import errors

    repo_id, revision = split_name(name)
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if isinstance(e, errors.GatedRepoError):
        return PlmError(f"{repo_id} is gated on the Hugging Face Hub",
                        f"accept its terms on https://huggingface.co/{repo_id} and log in (hf auth login)")
    if isinstance(e, errors.RepositoryNotFoundError):
        return PlmError(f"{name} is neither a local directory nor a model on the Hugging Face Hub",
                        f"{NAME_HINT}; a private model needs a login (hf auth login)")
    if isinstance(e, errors.RevisionNotFoundError):
        return PlmError(f"revision '{revision}' of {repo_id} not found on the Hugging Face Hub",
                        f"pass a branch, tag or commit it has, e.g. {repo_id}@main")
    if isinstance(e, errors.HFValidationError):
        return PlmError(f"{name} is neither a local directory nor a valid Hub model id ({reason})", NAME_HINT)
    if isinstance(e, (errors.LocalEntryNotFoundError, ConnectionError)) or unreachable(e):
        return offline_error(e, name, reason)
    if isinstance(e, errors.HfHubHTTPError):
        return PlmError(f"the Hugging Face Hub refused {name}: {reason}", "try again later, or pass a local directory")
    return None


def unreachable(e: Exception) -> bool:
    """A connection error or timeout of the HTTP client under huggingface_hub (httpx's, whose classes plm
    does not import), or its offline mode."""
    from huggingface_hub import errors

    kind = type(e).__name__
    return isinstance(e, (errors.OfflineModeIsEnabled, ConnectionError)) or "Connect" in kind or "Timeout" in kind


def offline_error(e: Exception, name: str, reason: str) -> PlmError:
    """The Hub cannot be reached (offline mode, no network) and the cache does not hold what `name` needs."""
    repo_id, revision = split_name(name)
    cached = Path(cache_dir() or default_cache()) / f"models--{repo_id.replace('/', '--')}"
    what = f"revision '{revision}' of {repo_id}" if revision and cached.is_dir() else name
    why = "HF_HUB_OFFLINE is set" if offline() else reason
    where = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
    if offline():
        return PlmError(f"cannot reach the Hugging Face Hub to fetch {what} ({why}) and the local Hub cache does not "
                        f"hold it, nor is {name} a local directory",
                        f"connect and unset HF_HUB_OFFLINE, or download it while online ({where}), or pass a local "
                        "directory")
    return PlmError(f"cannot reach the Hugging Face Hub to fetch {what} ({why})",
                    f"connect, or set HF_HUB_OFFLINE=1 with the model in the local cache ({where}), or pass a "
                    "local directory")


def default_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


# ---------------------------------------------------------------- push


def push(folder: str, repo: str) -> dict:
    """Upload the directory `folder` (a `plm export --format hf` output) to the Hub model repo `repo`,
    created if missing; returns {"repo", "url"}."""
    from huggingface_hub import HfApi

    if not ID.fullmatch(repo) or "@" in repo:
        raise PlmError(f"--push-to-hub {repo} is not a Hub model repo name", "pass ORG/NAME or NAME, e.g. me/bert-mini")
    api = HfApi()
    try:
        url = api.create_repo(repo, repo_type="model", exist_ok=True)
        api.upload_folder(folder_path=folder, repo_id=repo, repo_type="model", commit_message="Upload from plm export")
    except Exception as e:
        from huggingface_hub import errors

        if isinstance(e, errors.HfHubHTTPError) and e.response is not None and e.response.status_code in (401, 403):
            raise PlmError(f"the Hugging Face Hub refused to write {repo} ({e.response.status_code})",
                           "log in with a token that may write it (hf auth login, or export HF_TOKEN=...)") from e
        if unreachable(e):
            raise PlmError(f"cannot reach the Hugging Face Hub to push {folder} to {repo} ({type(e).__name__})",
                           f"connect (and unset HF_HUB_OFFLINE); {folder} is written, push it later with "
                           f"`hf upload {repo} {folder}`") from e
        raise
    return {"repo": repo, "url": str(url)}
