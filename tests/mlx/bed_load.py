"""Loading files in a given mlx-lm release of the bed (tests/mlx/make-bed.sh): the venv's mlx-lm is
the newest; older ones live in <venv>/old/mlx-lm-<version> and go first on PYTHONPATH."""
import os
import subprocess


def load_in_release(python, script, version, paths):
    """Runs `python script --load PATHS...` under mlx-lm `version`; returns (ok, the output's tail)."""
    return run_in_release(python, script, version, ["--load"] + list(paths))


def run_in_release(python, script, version, args):
    """Runs `python script ARGS...` under mlx-lm `version`; returns (ok, the output's tail)."""
    env = dict(os.environ)
    old = os.path.join(os.path.dirname(os.path.dirname(python)), "old", "mlx-lm-" + version)
    if os.path.isdir(old):
        env["PYTHONPATH"] = old
    r = subprocess.run([python, script] + list(args), capture_output=True, text=True, env=env)
    return r.returncode == 0, (r.stdout + r.stderr).strip()[-1500:]
