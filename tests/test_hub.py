"""Publishing: papa_surgery.hub.push with the real huggingface_hub client over real HTTP against tests/fake_hub.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fake_hub import FakeHub, build_tiny_checkpoint

from papa_surgery.conversion import hub
from papa_surgery.conversion.card import REPO_PLACEHOLDER

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_user_token"
TEXTS = ["the papa model is constant", "attention heads"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(folder, in-memory PAPA model, tokenizer) of a tiny BERT checkpoint (convert.py will replace the builder)."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-papa")


@pytest.fixture
def fake_hub(monkeypatch):
    from huggingface_hub import constants

    with FakeHub() as server:
        # As if HF_ENDPOINT pointed here when huggingface_hub was imported (some URLs are built from it).
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        yield server


@pytest.fixture(autouse=True)
def online_isolated(tmp_path, monkeypatch):
    """HF_HUB_OFFLINE=0 for these tests only, an isolated HF_HOME and no saved login or HF_TOKEN."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (plus the listing itself)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def reference_output(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**enc).last_hidden_state


LOAD_SCRIPT = r"""
import json, os, sys
# papa_surgery must not be importable here: drop the editable-install finder and the repository from the path.
sys.meta_path[:] = [f for f in sys.meta_path if "papa_surgery" not in getattr(f, "__module__", "")]
sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(sys.argv[1])]
try:
    import papa_surgery  # noqa: F401
except ImportError:
    pass
else:
    raise SystemExit("papa_surgery is importable in the fresh process")
import torch
from transformers import AutoModel, AutoTokenizer

repo, texts = sys.argv[2], json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)
model = AutoModel.from_pretrained(repo, trust_remote_code=True).eval()
enc = tokenizer(texts, return_tensors="pt", padding=True)
with torch.no_grad():
    out = model(**enc).last_hidden_state
print(json.dumps({"module": type(model).__module__, "cls": type(model).__name__, "out": out.tolist()}))
"""


def test_push_then_load_in_fresh_process(checkpoint, fake_hub, tmp_path):
    folder, model, tokenizer = checkpoint
    before = snapshot(folder)
    info = hub.push(folder, "user/tiny-papa", token=TOKEN, endpoint=fake_hub.endpoint)

    assert fake_hub.commit_count("user/tiny-papa") == 1  # one commit, not one per file
    assert info.oid == fake_hub.repos["user/tiny-papa"].refs["main"]
    assert str(info).startswith(fake_hub.endpoint)
    assert snapshot(folder) == before  # the local folder is only read
    remote = fake_hub.files("user/tiny-papa")
    assert set(remote) == set(before) | {".gitattributes"}
    for name in before:
        if name != "README.md":
            assert remote[name] == (folder / name).read_bytes(), name
    readme = remote["README.md"].decode()
    assert 'repo = "user/tiny-papa"' in readme and REPO_PLACEHOLDER not in readme
    commits = [p for m, p in fake_hub.requests if p.startswith("/api/models/user/tiny-papa/commit/")]
    assert len(commits) == 1

    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HF_ENDPOINT": fake_hub.endpoint,
        "HF_HOME": str(tmp_path / "fresh_hf_home"),
        "HF_TOKEN": TOKEN,
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-c", LOAD_SCRIPT, str(REPO_ROOT), "user/tiny-papa", json.dumps(TEXTS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["cls"] == "PapaBertModel"
    assert not result["module"].startswith("papa_surgery")  # the checkpoint's own code, downloaded from the hub
    torch.testing.assert_close(torch.tensor(result["out"]), reference_output(model, tokenizer), atol=1e-5, rtol=1e-5)
    downloads = {p for m, p in fake_hub.requests if "/resolve/" in p}
    assert any(p.endswith("/modeling_papa.py") for p in downloads)
    assert any(p.endswith("/model.safetensors") for p in downloads)


def test_rerun_push_is_safe(checkpoint, fake_hub):
    folder, _, _ = checkpoint
    first = hub.push(folder, "user/again", token=TOKEN, endpoint=fake_hub.endpoint)
    second = hub.push(folder, "user/again", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.commit_count("user/again") == 1  # nothing changed: no empty second commit
    assert first.oid == second.oid


def test_transient_commit_error_is_retried_by_the_client(checkpoint, fake_hub):
    folder, _, _ = checkpoint
    fake_hub.fail_commits = 1  # a 500 once: huggingface_hub retries the commit with backoff
    hub.push(folder, "user/transient", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.commit_count("user/transient") == 1


def test_failed_upload_leaves_folder_intact_and_retry_succeeds(checkpoint, fake_hub):
    folder, _, _ = checkpoint
    before = snapshot(folder)
    fake_hub.fail_commits, fake_hub.fail_status = 1, 400  # the server rejects the commit: no client retry
    with pytest.raises(RuntimeError, match="unchanged.*retry"):
        hub.push(folder, "user/flaky", token=TOKEN, endpoint=fake_hub.endpoint)
    assert snapshot(folder) == before
    assert fake_hub.commit_count("user/flaky") == 0
    hub.push(folder, "user/flaky", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.commit_count("user/flaky") == 1
    assert snapshot(folder) == before
    assert set(fake_hub.files("user/flaky")) == set(before) | {".gitattributes"}


def test_no_token_is_a_clear_error_before_any_request(checkpoint, fake_hub, monkeypatch):
    """No token: the fixes in the front end's words (``token=`` in Python only: the CLI has no such flag); offline,
    the offline mode is said first (a token would not help)."""
    from click.testing import CliRunner
    from huggingface_hub import constants

    from papa_surgery.cli import main

    folder, _, _ = checkpoint
    with pytest.raises(RuntimeError, match=r"huggingface-cli login.*HF_TOKEN, or pass token="):
        hub.push(folder, "user/nope", endpoint=fake_hub.endpoint)
    assert fake_hub.requests == []
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.endpoint)
    result = CliRunner().invoke(main, ["push", str(folder), "--repo-id", "user/nope"])
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "HF_TOKEN" in said and "token=" not in said, said
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    result = CliRunner().invoke(main, ["push", str(folder), "--repo-id", "user/nope"])
    assert result.exit_code == 1 and "HF_HUB_OFFLINE is set" in result.output, result.output


def test_token_from_env_and_private_flag_reaches_server(checkpoint, fake_hub, monkeypatch):
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    folder, _, _ = checkpoint
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.push(folder, "user/secret", private=True, endpoint=fake_hub.endpoint)
    assert fake_hub.create_payloads[-1]["visibility"] == "private"
    assert fake_hub.repos["user/secret"].private
    assert HfApi(endpoint=fake_hub.endpoint, token=TOKEN).model_info("user/secret").private
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=fake_hub.endpoint, token=False).model_info("user/secret")


def test_incomplete_or_foreign_folder_is_rejected_before_any_request(checkpoint, fake_hub, tmp_path):
    folder, _, _ = checkpoint
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    (broken / "modeling_papa.py").unlink()
    with pytest.raises(ValueError, match="modeling_papa.py"):
        hub.push(broken, "user/broken", token=TOKEN, endpoint=fake_hub.endpoint)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match="not a PAPA checkpoint"):
        hub.push(plain, "user/plain", token=TOKEN, endpoint=fake_hub.endpoint)
    with pytest.raises(ValueError, match="namespace"):
        hub.push(folder, "no-namespace", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.requests == []


def test_files_the_user_put_in_a_checkpoint_are_never_published(checkpoint, fake_hub, tmp_path):
    """A push uploaded the whole folder: a ``.env`` with a token, notes, data. Refused before any request, naming
    them; git's and huggingface_hub's bookkeeping and caches are passed over, and the push then goes through."""
    folder, _, _ = checkpoint
    mine = tmp_path / "mine"
    shutil.copytree(folder, mine)
    (mine / ".env").write_text("HF_TOKEN=hf_secret\n")
    (mine / "private").mkdir()
    (mine / "private" / "notes.txt").write_text("reviews")
    with pytest.raises(ValueError, match=r"did not write: \.env, private/; a push uploads the whole folder"):
        hub.push(mine, "user/mine", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.requests == [] and (mine / ".env").is_file()
    (mine / ".env").unlink()
    shutil.rmtree(mine / "private")
    (mine / "1_Pooling").mkdir()  # a module folder the checkpoint names, with a hidden file of the user's in it
    modules = [{"idx": 0, "name": "0", "path": "", "type": "x.T"}, {"idx": 1, "name": "1", "path": "1_Pooling"}]
    (mine / "modules.json").write_text(json.dumps(modules))
    (mine / "1_Pooling" / ".env").write_text("HF_TOKEN=hf_secret\n")
    with pytest.raises(ValueError, match=r"did not write: 1_Pooling/\.env;"):
        hub.push(mine, "user/mine", token=TOKEN, endpoint=fake_hub.endpoint)
    shutil.rmtree(mine / "1_Pooling")
    (mine / "modules.json").unlink()
    for bookkeeping in (".git", ".cache/huggingface", "__pycache__"):
        (mine / bookkeeping).mkdir(parents=True)
        (mine / bookkeeping / "x").write_text("local")
    (mine / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    # a code file of an older papa-surgery, which its model code imports, is the checkpoint's own
    (mine / "modeling_papa.py").write_text((mine / "modeling_papa.py").read_text() + "\nfrom .old_helper import X\n")
    (mine / "old_helper.py").write_text("X = 1\n")
    hub.push(mine, "user/mine", token=TOKEN, endpoint=fake_hub.endpoint)
    remote = set(fake_hub.files("user/mine"))
    assert "old_helper.py" in remote
    assert {"config.json", "model.safetensors", ".gitattributes"} <= remote
    assert not {name for name in remote if name.startswith((".git/", ".cache/", "__pycache__/"))}


def test_name_clash_is_a_clear_error(checkpoint, fake_hub):
    folder, _, _ = checkpoint
    fake_hub.add_repo("other/taken", owner="other")
    with pytest.raises(RuntimeError, match="no write access to 'other/taken'"):
        hub.push(folder, "other/taken", token=TOKEN, endpoint=fake_hub.endpoint)
    assert fake_hub.commit_count("other/taken") == 0
    with pytest.raises(RuntimeError, match="403"):
        hub.push(folder, "someone-else/new", token=TOKEN, endpoint=fake_hub.endpoint)
    with pytest.raises(RuntimeError, match="token was rejected"):
        hub.push(folder, "user/x", token="hf_bad", endpoint=fake_hub.endpoint)


def test_revision_branch_and_pull_request(checkpoint, fake_hub):
    folder, _, _ = checkpoint
    hub.push(folder, "papa-org/tiny", token=TOKEN, endpoint=fake_hub.endpoint, revision="v1")
    repo = fake_hub.repos["papa-org/tiny"]
    assert "config.json" in fake_hub.files("papa-org/tiny", "v1")
    assert "config.json" not in fake_hub.files("papa-org/tiny", "main")
    info = hub.push(folder, "papa-org/tiny", token=TOKEN, endpoint=fake_hub.endpoint, create_pr=True)
    assert info.pr_url and info.pr_url.endswith("/discussions/1")
    assert "config.json" in fake_hub.files("papa-org/tiny", "refs/pr/1")
    assert "config.json" not in fake_hub.files("papa-org/tiny", "main")
    assert fake_hub.commit_count("papa-org/tiny") == 2 and len(repo.refs) == 3
    with pytest.raises(ValueError, match="create_pr"):
        hub.push(folder, "papa-org/tiny", token=TOKEN, endpoint=fake_hub.endpoint, revision="v1", create_pr=True)
