"""A job for `ddlf submit` (tests/test_deploy_ssh.py): train the numpy softmax model on the
cluster the job was submitted to, print a RESULT line, exit with status 3 when asked to.

    ddlf submit --cluster cluster.yaml tests/helpers_modules/submit_train.py WORKERS [--fail]

``ddlf.init()`` takes the cluster from DDLF_ADDRESS, and the job's folder (this one, so
numpy_trainer.py too) is the job's working_dir on every host: the trainers import it there.
"""

from __future__ import annotations

import json
import os
import sys
import time

from numpy_trainer import NumpyTrainer, hard_blobs_dataset, softmax_model_fn

import ddlf_actors as ddlf
from ddlf_actors.apps import train_sync


def main() -> int:
    if "--sleep" in sys.argv:   # for the Ctrl-C test: wait to be stopped
        ddlf.init()
        print("SLEEPING", flush=True)
        time.sleep(600)
        return 0
    workers = int(sys.argv[1])
    info = ddlf.init()
    nodes = [n for n in ddlf.nodes() if n["alive"]]
    print(f"joined {info.address}: {len(nodes)} nodes", flush=True)
    result = train_sync(softmax_model_fn(64, 4), hard_blobs_dataset, workers=workers,
                        master_epochs=3, rounds_per_epoch=2, trainer_cls=NumpyTrainer,
                        progress=False)
    print("RESULT " + json.dumps({
        "nodes": len(nodes), "accuracy": result.history[-1]["test_accuracy"],
        "rounds": len(result.history), "cwd": os.getcwd()}), flush=True)
    ddlf.shutdown()
    return 3 if "--fail" in sys.argv else 0


if __name__ == "__main__":
    sys.exit(main())
