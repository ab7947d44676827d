"""Service declarations (as service_plan's `services` takes them) shared by the unit tests.

Each is a function that returns a fresh dict, so that a test module, or a test, that changes its declaration
changes only its own.
"""


def coder(**fields):
    """The DDTREE service coder: budget 15, top_k 8, on GPUs 0 and 1 at tp 2, port 30000. fields replace or add
    top-level keys (speculative={...} for another algorithm or an autotune declaration)."""
    service = {
        "name": "coder",
        "model_path": "/models/coder",
        "draft_model_path": "/models/coder-dflash",
        "gpus": [0, 1],
        "tp_size": 2,
        "port": 30000,
        "speculative": {"algorithm": "DDTREE", "budget": 15, "top_k": 8},
    }
    service.update(fields)
    return service


def tuned_coder():
    """coder on GPU 0 alone, tuned: budgets 4 and 8, top_k 4, at concurrency 1 and 16, measured on GPU 1 at
    port 30100."""
    return {
        "name": "coder",
        "model_path": "/models/coder",
        "draft_model_path": "/models/coder-dflash",
        "gpus": [0],
        "port": 30000,
        "speculative": {
            "algorithm": "DDTREE",
            "autotune": {"budgets": [4, 8], "top_k": [4], "concurrency": [1, 16], "gpus": [1], "port": 30100},
        },
    }
