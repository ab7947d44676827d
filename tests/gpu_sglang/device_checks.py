"""The collection's own checks on the device, against the real SGLang 0.5.23 with the overlay release.

Usage: python device_checks.py OUTDIR MODELS   (after device-setup.sh; writes OUTDIR/checks.json)
  * `python -m sglang_overlay.predicates --json` with the release, `--check-ddtree`, and the pristine
    matrix (the release's predicates.py run by path, `--no-plugins`);
  * the spec_verify module (plugins/modules/spec_verify.py) run as Ansible runs a module (an args file
    with ANSIBLE_MODULE_ARGS), on the stack /tmp/stack and the release /tmp/release: the predicate
    matrix comparison and the dry parse of the DDTREE, DFLASH and NONE servers' flags, plus two that
    must fail (a bad DDTREE flag value, an unknown flag).
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import scenario  # noqa: E402

SITE = os.environ.get("SGLANG_SITE", "/tmp/site")
RELEASE = "/tmp/release"
STACK = "/tmp/stack"


def sh(cmd, env=None, timeout=120):
    p = subprocess.run(
        cmd, capture_output=True, text=True, check=False, env=dict(os.environ, **(env or {})), timeout=timeout
    )
    return p.returncode, p.stdout, p.stderr


def first_json(text):
    try:
        return json.loads(text[text.index("{") :])
    except ValueError:
        return None


def module(args, tmp):
    ac = os.path.join(tmp, "ac")
    link = os.path.join(ac, "ansible_collections", "ddtree", "sglang")
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link))
        os.symlink(REPO, link)
    path = os.path.join(tmp, "args-%d.json" % abs(hash(json.dumps(args))))
    with open(path, "w") as fh:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, fh)
    rc, out, err = sh(
        [sys.executable, "-m", "ansible_collections.ddtree.sglang.plugins.modules.spec_verify", path],
        env={"PYTHONPATH": ac + ":" + SITE},
        timeout=300,
    )
    res = first_json(out) or {"unparsed_stdout": out[-2000:]}
    res.pop("with_release", None)
    return {"rc": rc, "result": res, "stderr_tail": err[-1500:]}


def main():
    outdir, models = sys.argv[1], sys.argv[2]
    tmp = os.path.join(outdir, "checks-tmp")
    os.makedirs(tmp, exist_ok=True)
    rel_env = {"PYTHONPATH": RELEASE + "/site:" + SITE}
    checks = {}
    rc, out, err = sh([sys.executable, "-m", "sglang_overlay.predicates", "--json"], rel_env)
    checks["predicates_with_release"] = {"rc": rc, "json": first_json(out), "stderr_tail": err[-1500:]}
    rc, out, err = sh([sys.executable, "-m", "sglang_overlay.predicates", "--json", "--check-ddtree"], rel_env)
    checks["predicates_check_ddtree"] = {"rc": rc, "stderr_tail": err[-800:]}
    rc, out, err = sh(
        [sys.executable, RELEASE + "/site/sglang_overlay/predicates.py", "--json", "--no-plugins"], {"PYTHONPATH": SITE}
    )
    checks["predicates_pristine"] = {"rc": rc, "json": first_json(out), "stderr_tail": err[-1500:]}
    base = scenario.flags(models, 30000)
    cases = {
        "spec_verify_ddtree_flags": base + scenario.spec_flags(models, "DDTREE"),
        "spec_verify_dflash_flags": base + scenario.spec_flags(models, "DFLASH"),
        "spec_verify_none_flags": base,
        "spec_verify_bad_budget_must_fail": base
        + scenario.spec_flags(models, "DDTREE")[:-4]
        + ["--speculative-ddtree-budget", "0"],
        "spec_verify_unknown_flag_must_fail": base + scenario.spec_flags(models, "DDTREE") + ["--no-such-flag"],
    }
    for name, fl in cases.items():
        checks[name] = module({"stack": STACK, "release": RELEASE, "flags": fl, "environment": {}}, tmp)
        print(name, "rc", checks[name]["rc"], (checks[name]["result"].get("msg") or "")[:200], flush=True)
        with open(os.path.join(outdir, "checks.json"), "w") as fh:
            json.dump(checks, fh, indent=1)
    ok = (
        checks["predicates_with_release"]["rc"] == 0
        and checks["predicates_check_ddtree"]["rc"] == 0
        and checks["predicates_pristine"]["rc"] == 0
        and all(checks[n]["rc"] == 0 for n in cases if not n.endswith("must_fail"))
        and all(checks[n]["rc"] != 0 for n in cases if n.endswith("must_fail"))
    )
    checks["all_as_expected"] = ok
    with open(os.path.join(outdir, "checks.json"), "w") as fh:
        json.dump(checks, fh, indent=1)
    print("checks all as expected:", ok, flush=True)


if __name__ == "__main__":
    main()
