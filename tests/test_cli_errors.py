"""The command line's error contract: whatever escapes a command becomes one line and an exit code."""

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import run, tiny_corpus, tiny_recipe
from plmcli import api
from plmcli.errors import Interrupted, PlmError, os_error


def one_line(res, code):
    assert res.exit_code == code, res.output
    err = res.stderr.strip()
    assert "\n" not in err and "Traceback" not in res.output, res.output
    return err


def raising(exc):
    def fail(*args, **kwargs):
        raise exc

    return fail


def test_bare_interrupt_says_nothing_was_written(monkeypatch, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    monkeypatch.setattr(api, "eval_ppl", raising(KeyboardInterrupt()))
    assert one_line(run("eval-ppl", text), 130) == "interrupted — nothing was written"
    monkeypatch.setattr(api, "list_recipes", raising(KeyboardInterrupt()))
    assert one_line(run("recipes"), 130) == "interrupted — nothing was written"


def test_handled_interrupt_says_what_it_left(monkeypatch):
    msg = "the checkpoint of step 26 is in runs/x; continue with `plm pretrain --resume --out runs/x`"
    monkeypatch.setattr(api, "pretrain", raising(Interrupted(msg)))
    assert one_line(run("pretrain", "--recipe", "gpt-mini"), 130) == f"interrupted — {msg}"


def test_internal_error_is_one_line_and_debug_shows_it(monkeypatch):
    monkeypatch.setattr(api, "generate", raising(ValueError("boom\nsecond line")))
    err = one_line(run("generate", "--prompt", "x"), 1)
    assert err.startswith("error: internal error in `plm generate`: ValueError: boom — this is a bug in plm")
    assert "plm --debug generate" in err
    res = run("--debug", "generate", "--prompt", "x")
    assert isinstance(res.exception, ValueError)


def test_internal_error_in_a_subcommand_names_it(monkeypatch):
    monkeypatch.setattr(api, "show_recipe", raising(RuntimeError("bad")))
    assert one_line(run("recipes", "show", "gpt-mini"), 1).startswith(
        "error: internal error in `plm recipes show`: RuntimeError: bad")


def test_os_errors_name_the_path_and_the_fix(monkeypatch, tmp_path):
    cases = [
        (OSError(errno.EROFS, "Read-only file system", "/ro/out"),
         "error: cannot write /ro/out: Read-only file system — choose a location on a writable filesystem"),
        (OSError(errno.ENOSPC, "No space left on device", "/full/x"),
         "error: cannot write /full/x: No space left on device — free space on that filesystem, or write somewhere with room"),
        (OSError(errno.EFBIG, "File too large", "/big/model.safetensors"),
         "error: cannot write /big/model.safetensors: File too large — the file exceeds the size limit (ulimit -f, "
         "or the filesystem's); raise it or write elsewhere"),
        (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/etc/passwd/x"),
         "error: cannot use /etc/passwd/x: Not a directory — a file stands where a directory is needed; remove it or choose another path"),
        (PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "new")),
         f"error: cannot write {tmp_path / 'new'}: Permission denied — check its permissions, or choose a location you may write to"),
        (OSError(errno.ENOSPC, "No space left on device"),  # f.write() names no file
         "error: cannot write: No space left on device — free space on that filesystem, or write somewhere with room"),
    ]
    for exc, want in cases:
        monkeypatch.setattr(api, "tokenize", raising(exc))
        assert one_line(run("tokenize", "x.txt", "--out", tmp_path / "o"), 2) == want
    wrapped = RuntimeError("file write failed")  # torch.save, datasets: the OSError in the chain is explained
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device", "/full/y")
    monkeypatch.setattr(api, "tokenize", raising(wrapped))
    assert one_line(run("tokenize", "x.txt", "--out", tmp_path / "o"), 2).startswith("error: cannot write /full/y: No space")


def test_a_failure_inside_the_cache_names_plm_cache(tmp_path):
    cache = tmp_path / "cache"
    e = os_error(OSError(errno.ENOSPC, "No space left on device", str(cache / "corpora" / "ab" / "x.arrow")),
                 {str(cache): ("PLM_CACHE", "export PLM_CACHE=<a writable directory> to move the cache")})
    assert str(e) == (f"cannot write {cache}/corpora/ab/x.arrow: No space left on device — free space on that "
                      f"filesystem, or write somewhere with room: PLM_CACHE is {cache}; export PLM_CACHE=<a "
                      "writable directory> to move the cache")


def test_unwritable_plm_cache_fails_before_tokenizing(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PLM_CACHE", str(blocker / "cache"))
    recipe, corpus = tiny_recipe(tmp_path / "tiny.yaml"), tiny_corpus(tmp_path / "c.txt")
    err = one_line(run("pretrain", "--recipe", recipe, "--data", corpus, "--out", tmp_path / "run"), 2)
    assert err == (f"error: cannot write $PLM_CACHE ({blocker / 'cache'}): Not a directory — export "
                   "PLM_CACHE=<a writable directory> (prepared corpora are cached there)")
    assert not (tmp_path / "run").exists()


def test_wrapped_plm_error_surfaces_as_itself(monkeypatch, tmp_path):
    wrapped = RuntimeError("An error occurred while generating the dataset")
    wrapped.__cause__ = PlmError("'x.txt' has no text", "pass a file with text")
    monkeypatch.setattr(api, "tokenize", raising(wrapped))
    assert one_line(run("tokenize", "x.txt", "--out", tmp_path / "o"), 2) == "error: 'x.txt' has no text — pass a file with text"


def test_each_process_prefixes_its_line(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    err = one_line(run("pretrain", "--recipe", "gpt-mni"), 2)
    assert err.startswith("error (process 1 of 2): unknown recipe 'gpt-mni'")
    monkeypatch.setattr(api, "pretrain", raising(KeyboardInterrupt()))
    assert one_line(run("pretrain", "--recipe", "gpt-mini"), 130) == "interrupted (process 1 of 2) — nothing was written"


@pytest.mark.parametrize("args, line", [
    (["eval-ppl"], "error: missing argument 'files' — see `plm eval-ppl --help`"),
    (["pretrain", "--max-step", "3"], "error: plm pretrain has no option --max-step — did you mean --max-steps or --max-tokens?"),
    (["pretrain", "--max-steps", "x"], "error: invalid value for '--max-steps': "),
    (["generate", "--zzzz"], "error: plm generate has no option --zzzz — "),
])
def test_usage_errors_are_one_line_too(args, line):
    """An unknown, missing or malformed option: the README's one `error: … — …` line with exit 2, not Typer's box."""
    res = run(*args)
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.startswith(line) and "\n" not in err and "╭" not in res.output, err


def test_help_lists_the_exit_codes():
    out = " ".join(run("--help").output.split())
    assert "Exit codes: 0 done; 2 bad input" in out and "130 interrupted" in out and "1 an internal error" in out


# A real Ctrl-C at the worst moment: the output is complete in its temp dir, one rename from done.
BLOCK_BEFORE_RENAME = textwrap.dedent("""
    import signal, sys, time
    # a user's Ctrl-C at a terminal: pytest started as a background job (`cmd &` in a script) hands its children
    # SIGINT ignored, as POSIX shells do for background jobs, and the interrupt would never arrive
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import plmcli.data.store as store
    def stalled(tmp, dest):
        print("READY", flush=True)
        time.sleep(120)
    store.swap_into = stalled
    from plmcli.cli import app
    sys.argv = ["plm", *sys.argv[1:]]
    app()
""")


def _interrupt_before_rename(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    p = subprocess.Popen([sys.executable, "-c", BLOCK_BEFORE_RENAME, *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    try:
        line = p.stdout.readline()
        assert line.strip() == "READY", p.stderr.read()
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    return p.returncode, err


def test_interrupted_tokenize_and_make_mlm_data_leave_nothing_complete(tmp_path):
    recipe = tmp_path / "bert.yaml"
    recipe.write_text("extends: bert-mini\ntokenizer: {vocab_size: 300, min_frequency: 1}\n")
    corpus = tiny_corpus(tmp_path / "c.txt", n_docs=40)
    code, err = _interrupt_before_rename(["tokenize", corpus, "--out", tmp_path / "tok", "--recipe", recipe], tmp_path)
    assert code == 130 and err.strip() == "interrupted — nothing was written", err
    assert not (tmp_path / "tok").exists()
    assert run("tokenize", corpus, "--out", tmp_path / "tok", "--recipe", recipe).exit_code == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    code, err = _interrupt_before_rename(["make-mlm-data", tmp_path / "tok", "--out", tmp_path / "mlm",
                                          "--max-seq-len", 32, "--dupe-factor", 1], tmp_path)
    assert code == 130 and err.strip() == "interrupted — nothing was written", err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no mlm/, no .mlm.tmp-*
