"""A driver that trains with checkpoints on its own embedded cluster, for kill-and-resume tests.

    python -m helpers_modules.checkpointing_driver CHECKPOINT_DIR [sync|async]

Each round takes a little while (``DDLF_TEST_FIT_SLEEP`` in the trainers), so a test can
SIGKILL this process mid-run; its head and node follow it (they hold a stdin lifeline).
"""

from __future__ import annotations

import json
import sys

import ddlf_actors as ddlf
from ddlf_actors.apps import train_async, train_sync
from helpers_modules.numpy_trainer import SigkillOnce, hard_blobs_dataset, softmax_model_fn

RUN = dict(workers=2, master_epochs=3, rounds_per_epoch=3, trainer_cls=SigkillOnce,
           progress=False, seed=11)
MODEL = softmax_model_fn(64, 4)


def main() -> None:
    directory, scheme = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "sync")
    ddlf.init(num_cpus=2)
    env = {"runtime_env": {"env_vars": {"DDLF_TEST_FIT_SLEEP": "0.3"}}}
    train = train_sync if scheme == "sync" else train_async
    result = train(MODEL, hard_blobs_dataset, checkpoint_dir=directory, trainer_options=env,
                   **RUN)
    print(json.dumps({"rounds": [r["round"] for r in result.history]}), flush=True)
    ddlf.shutdown()


if __name__ == "__main__":
    main()
