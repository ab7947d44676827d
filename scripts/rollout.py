"""Roll a Git revision out to a fleet: check it out, plan (check + diff), roll out canary first, report.

The entry point CI pipelines call (docs/gitops.md); a person can too. Against the lab:
  lab/run scripts/rollout --revision main
Against a fleet (from a rollout node with the controller venv on PATH):
  scripts/rollout --repo git@git.example:ml/fleet.git --revision "$SHA" \
      --inventory inventories/prod/hosts.yml --report-dir out/ -- --vault-password-file ~/.vault-pass

What it does:
 1. fetches the repository into a mirror under --workdir and checks the revision out into its own
    worktree there (one per commit, reused, never changed in place);
 2. runs site.yml from that worktree in check and diff mode: plan.json and plan.md in --report-dir;
 3. unless --plan-only, runs site.yml for real: the lock, preflight, stacks, then services canary first
    with the health gate and automatic rollback: rollout.json and rollout.md in --report-dir.
Every playbook run takes the per-host rollout lock (playbooks/lock.yml): a second trigger for any of
the same hosts waits up to --lock-timeout seconds, or is refused (0); it never runs over a rollout.

Exit status: 0 done (plan: nothing failed; rollout: every targeted host converged and passed its gate),
1 the rollout failed (the report says which host, and what was rolled back), 2 bad input or the plan
failed (nothing was changed), 3 the rollout paused: a bake's re-check was inconclusive (a host unreachable,
or the check could not look at the service; nothing was rolled back; the resume command is printed, and is
the same rollout again, pinned to the commit), 75 another rollout holds the lock (nothing was changed).
"""

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED, EXIT_LOCKED = 1, 2, 3, 75
KEEP_WORKTREES = 5
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# This checkout's collection (collections/ links to it), for the cache folder's rule.
sys.path.insert(0, os.path.join(REPO_ROOT, "collections"))
from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir  # noqa: E402


def log(message):
    print("==> %s" % message, file=sys.stderr, flush=True)


def die(message, code=EXIT_USAGE):
    print("ERROR: %s" % message, file=sys.stderr, flush=True)
    sys.exit(code)


def git(*args, cwd=None, capture=True):
    proc = subprocess.run(["git", *args], cwd=cwd, text=True, capture_output=capture, check=False)
    if proc.returncode != 0:
        raise RuntimeError("git %s failed: %s" % (" ".join(args), (proc.stderr or proc.stdout or "").strip()[-800:]))
    return proc.stdout.strip() if capture else ""


def default_workdir():
    return cache_dir("rollouts")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="scripts/rollout",
        description=__doc__.split("\n\n", maxsplit=1)[0],
        epilog="Arguments after -- go to ansible-playbook unchanged (vault, -e, -v, ...).",
    )
    parser.add_argument(
        "--revision", required=True, help="commit, tag or branch to roll out (a branch means its tip on --repo)"
    )
    parser.add_argument(
        "--repo", default=REPO_ROOT, help="Git URL or path of the fleet repository (default: this checkout's)"
    )
    parser.add_argument(
        "--inventory",
        default="inventories/lab/hosts.yml",
        help="inventory, relative to the repository (default: %(default)s)",
    )
    parser.add_argument("--limit", help="hosts or groups to roll out to (ansible-playbook --limit)")
    parser.add_argument(
        "--report-dir", help="where plan.{json,md} and rollout.{json,md} go (default: <workdir>/reports/<commit>)"
    )
    parser.add_argument(
        "--workdir",
        default=os.environ.get("DDTREE_ROLLOUT_WORKDIR") or default_workdir(),
        help="mirror and worktrees (default: $DDTREE_ROLLOUT_WORKDIR or %(default)s)",
    )
    parser.add_argument("--plan-only", action="store_true", help="stop after the plan (for pull requests)")
    parser.add_argument("--skip-plan", action="store_true", help="roll out without the check-mode plan first")
    parser.add_argument(
        "--lock-timeout",
        type=float,
        default=float(os.environ.get("DDTREE_ROLLOUT_LOCK_TIMEOUT", 3600)),
        help="seconds to wait for a rollout in progress on any of the same hosts; 0 refuses at once (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--trigger",
        default=os.environ.get("DDTREE_ROLLOUT_TRIGGER", "manual"),
        help="what started this, for the report (default: $DDTREE_ROLLOUT_TRIGGER or 'manual')",
    )
    parser.add_argument("playbook_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.plan_only and args.skip_plan:
        parser.error("--plan-only and --skip-plan contradict each other: pick one")
    if args.lock_timeout < 0:
        parser.error(
            "--lock-timeout %s is negative: use 0 to refuse at once, or the seconds to wait" % args.lock_timeout
        )
    if os.path.isabs(args.inventory) or ".." in args.inventory.split(os.sep):
        parser.error(
            "--inventory %s must be a path inside the repository (the inventory is versioned with the rollout)"
            % args.inventory
        )
    return args


class Locked:
    """An flock on a file for the life of the with-block (shared or exclusive)."""

    def __init__(self, path, shared=False, wait=True):
        self.path, self.mode = path, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def checkout(repo, revision, workdir):
    """The revision's commit id and a worktree of it (created once, then reused)."""
    os.makedirs(workdir, exist_ok=True)
    mirror = os.path.join(workdir, "mirror.git")
    # One fetch at a time: two triggers share the mirror.
    with Locked(os.path.join(workdir, ".mirror.lock")):
        if not os.path.isdir(mirror):
            log("cloning %s" % repo)
            shutil.rmtree(mirror + ".tmp", ignore_errors=True)  # left by an interrupted clone
            git("clone", "--quiet", "--mirror", repo, mirror + ".tmp", capture=False)
            os.rename(mirror + ".tmp", mirror)
        else:
            git("-C", mirror, "remote", "set-url", "origin", repo)
            log("fetching %s" % repo)
            git("-C", mirror, "fetch", "--quiet", "--prune", "origin")
        try:
            commit = git("-C", mirror, "rev-parse", "--verify", "--quiet", revision + "^{commit}")
        except RuntimeError:
            die("revision %r is not in %s: give a commit, tag or branch that exists there" % (revision, repo))
        tree = os.path.join(workdir, "trees", commit)
        if not os.path.isfile(os.path.join(tree, ".ddtree-rollout-complete")):
            if os.path.exists(tree):
                git("-C", mirror, "worktree", "remove", "--force", tree)
            git("-C", mirror, "worktree", "prune")
            log("checking out %s (%s)" % (revision, commit[:12]))
            git("-C", mirror, "worktree", "add", "--quiet", "--detach", tree, commit, capture=False)
            open(os.path.join(tree, ".ddtree-rollout-complete"), "w").close()
        os.utime(tree)
    return commit, mirror, tree


def prune_worktrees(mirror, workdir, keep_commit):
    """Remove all but the newest worktrees; never one a rollout is using (it holds a shared lock on it)."""
    trees_root = os.path.join(workdir, "trees")
    trees = sorted(
        (path for path in (os.path.join(trees_root, name) for name in os.listdir(trees_root)) if os.path.isdir(path)),
        key=os.path.getmtime,
        reverse=True,
    )
    for tree in trees[KEEP_WORKTREES:]:
        if os.path.basename(tree) == keep_commit:
            continue
        try:
            with Locked(tree + ".lock", wait=False):
                git("-C", mirror, "worktree", "remove", "--force", tree)
                shutil.rmtree(tree, ignore_errors=True)
                os.remove(tree + ".lock")
        except (BlockingIOError, RuntimeError, OSError):
            continue


def run_playbook(tree, args, commit, report_dir, check):
    command = ["ansible-playbook", "-i", args.inventory, "site.yml"]
    if args.limit:
        command += ["--limit", args.limit]
    if check:
        command += ["--check", "--diff"]
    command += args.playbook_args
    env = dict(
        os.environ,
        DDTREE_ROLLOUT_REPORT_DIR=report_dir,
        DDTREE_ROLLOUT_REVISION=commit,
        DDTREE_ROLLOUT_TRIGGER=args.trigger,
        DDTREE_ROLLOUT_LOCK_TIMEOUT="%g" % args.lock_timeout,
    )
    env.pop("DDTREE_ROLLOUT_REPORT", None)
    log("%s: %s" % ("plan" if check else "rollout", " ".join(command)))
    code = subprocess.call(command, cwd=tree, env=env)
    kind = "plan" if check else "rollout"
    report = None
    path = os.path.join(report_dir, kind + ".json")
    # A report older than this run is not this run's.
    if os.path.isfile(path) and os.path.getmtime(path) >= START_TIME:
        with open(path) as handle:
            report = json.load(handle)
    return code, report


def resume_command(argv, commit):
    """This command again, pinned to the commit it rolled out (a branch may have moved since)."""
    args, rest, skip = [], list(argv), False
    for index, arg in enumerate(rest):
        if skip:
            skip = False
            continue
        if arg == "--":
            args += rest[index:]
            break
        if arg == "--revision":
            skip = True
            continue
        if arg.startswith("--revision="):
            continue
        args.append(arg)
    return "cd %s && %s" % (
        shlex.quote(REPO_ROOT),
        " ".join(shlex.quote(arg) for arg in ["scripts/rollout", "--revision", commit] + args),
    )


def main(argv):
    args = parse_args(argv)
    if shutil.which("ansible-playbook") is None:
        die("ansible-playbook is not on PATH: run scripts/bootstrap and put its venv first on PATH (lab/run does)")
    commit, mirror, tree = checkout(args.repo, args.revision, os.path.abspath(args.workdir))
    report_dir = os.path.abspath(args.report_dir or os.path.join(args.workdir, "reports", commit))
    os.makedirs(report_dir, exist_ok=True)
    if not os.path.isfile(os.path.join(tree, args.inventory)):
        die("inventory %s does not exist in revision %s of %s" % (args.inventory, commit[:12], args.repo))
    with Locked(tree + ".lock", shared=True):
        prune_worktrees(mirror, args.workdir, commit)
        if not args.skip_plan:
            code, report = run_playbook(tree, args, commit, report_dir, check=True)
            if report and report["verdict"] == "refused":
                log("refused: another rollout holds the lock (%s)" % os.path.join(report_dir, "plan.md"))
                return EXIT_LOCKED
            if code != 0:
                log("the plan failed; nothing was changed (%s)" % os.path.join(report_dir, "plan.md"))
                return EXIT_USAGE
            log("plan: %s" % os.path.join(report_dir, "plan.md"))
            if args.plan_only:
                return 0
        code, report = run_playbook(tree, args, commit, report_dir, check=False)
    if report and report["verdict"] == "refused":
        log("refused: another rollout holds the lock (%s)" % os.path.join(report_dir, "rollout.md"))
        return EXIT_LOCKED
    if report and report["verdict"] == "paused":
        log("PAUSED: %s (%s)" % (report.get("paused", ""), os.path.join(report_dir, "rollout.md")))
        log("resume: %s" % resume_command(argv, commit))
        return EXIT_PAUSED
    log("rollout %s: %s" % ("succeeded" if code == 0 else "FAILED", os.path.join(report_dir, "rollout.md")))
    return 0 if code == 0 else EXIT_FAILED


START_TIME = time.time()

if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except RuntimeError as error:
        die(str(error))
