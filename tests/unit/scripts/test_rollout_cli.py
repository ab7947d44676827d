"""scripts/rollout: argument checks and the checkout of a revision (no playbook runs here)."""

import importlib.machinery
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "rollout.py"


@pytest.fixture(scope="module")
def rollout():
    loader = importlib.machinery.SourceFileLoader("rollout_cli", str(SCRIPT))
    spec = importlib.util.spec_from_loader("rollout_cli", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def repo(tmp_path):
    """A repository with two commits on main; returns (path, [first, second])."""
    path = tmp_path / "fleet"
    commits = []
    subprocess.run(["git", "init", "-q", "--initial-branch=main", str(path)], check=True)
    for content in ("one", "two"):
        (path / "site.yml").write_text(content + "\n")
        subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
        subprocess.run(
            ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", content],
            check=True,
        )
        commits.append(
            subprocess.run(
                ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    return path, commits


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--revision", "main", "--plan-only", "--skip-plan"], "contradict"),
        (["--revision", "main", "--lock-timeout", "-5"], "-5.0 is negative"),
        (["--revision", "main", "--inventory", "/etc/ansible/hosts"], "must be a path inside the repository"),
        (["--revision", "main", "--inventory", "../other/hosts.yml"], "must be a path inside the repository"),
    ],
)
def test_bad_arguments_are_refused_with_the_value_and_the_fix(rollout, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        rollout.parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_playbook_arguments_after_the_double_dash_are_kept(rollout):
    args = rollout.parse_args(["--revision", "v1", "--", "--vault-password-file", "/run/vault", "-v"])
    assert args.playbook_args == ["--vault-password-file", "/run/vault", "-v"]


def test_a_revision_gets_its_own_worktree_reused_and_a_moved_branch_a_new_one(rollout, repo, tmp_path):
    path, (first, second) = repo
    workdir = str(tmp_path / "work")
    commit, mirror, tree = rollout.checkout(str(path), "main", workdir)
    assert commit == second and Path(tree, "site.yml").read_text() == "two\n" and tree.endswith(second)
    assert rollout.checkout(str(path), first[:10], workdir)[0] == first
    # Reused, not checked out again: a file added to the tree by hand is still there.
    Path(tree, "marker").write_text("")
    assert os.path.exists(os.path.join(rollout.checkout(str(path), second, workdir)[2], "marker"))
    # A new commit on main is fetched.
    (path / "site.yml").write_text("three\n")
    subprocess.run(
        ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qam", "three"],
        check=True,
    )
    commit, _mirror, tree = rollout.checkout(str(path), "main", workdir)
    assert commit not in (first, second) and Path(tree, "site.yml").read_text() == "three\n"


def test_an_unknown_revision_names_it_and_the_repository(rollout, repo, tmp_path, capsys):
    path = repo[0]
    with pytest.raises(SystemExit) as exit_info:
        rollout.checkout(str(path), "no-such-branch", str(tmp_path / "work"))
    assert exit_info.value.code == 2
    assert "revision 'no-such-branch' is not in %s" % path in capsys.readouterr().err


def test_old_worktrees_are_pruned_but_never_the_one_in_use(rollout, tmp_path):
    path = tmp_path / "fleet"
    subprocess.run(["git", "init", "-q", "--initial-branch=main", str(path)], check=True)
    commits = []
    for n in range(8):
        (path / "n").write_text(str(n))
        subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
        subprocess.run(
            ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", str(n)],
            check=True,
        )
        commits.append(
            subprocess.run(
                ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    workdir = str(tmp_path / "work")
    for commit in commits:
        _commit, mirror, _tree = rollout.checkout(str(path), commit, workdir)
    trees = Path(workdir, "trees")
    with rollout.Locked(str(trees / commits[0]) + ".lock", shared=True):  # a rollout still uses the oldest
        rollout.prune_worktrees(mirror, workdir, commits[-1])
    left = sorted(p.name for p in trees.iterdir() if p.is_dir())
    assert left == sorted([commits[0]] + commits[-5:])


def test_the_resume_command_is_this_command_pinned_to_the_commit(rollout):
    command = rollout.resume_command(
        [
            "--revision",
            "main",
            "--inventory",
            "inventories/prod/hosts.yml",
            "--",
            "-e",
            '{"ddtree_rollout_policy": {"bake_time_s": 300}}',
        ],
        "a" * 40,
    )
    assert command.endswith(
        "scripts/rollout --revision %s --inventory inventories/prod/hosts.yml -- -e "
        '\'{"ddtree_rollout_policy": {"bake_time_s": 300}}\'' % ("a" * 40)
    )
    assert command.startswith("cd ") and " main" not in command
    assert rollout.resume_command(["--revision=main", "--skip-plan"], "b" * 40).endswith(
        "--revision %s --skip-plan" % ("b" * 40)
    )
    assert rollout.EXIT_PAUSED not in (0, rollout.EXIT_FAILED, rollout.EXIT_USAGE, rollout.EXIT_LOCKED)
