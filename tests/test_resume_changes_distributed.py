"""The mid-epoch loader refusal on a data-parallel Trainer (real local Ray, 2 workers): it
resumes the single-process checkpoint as one run, and refuses a loader that would serve the rest
of the epoch other samples before any worker steps."""

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from test_resume_changes import resumed_mid_epoch
from trainer_models import blobs


def test_two_workers_refuse_another_batch_size_mid_epoch_and_finish_it_with_the_runs(ray_cluster, tmp_path):
    data = blobs(96)
    one = resumed_mid_epoch(tmp_path / "ck", data)  # 3 of 6 batches of 16 done, one process
    two = gc.Trainer(tmp_path / "ck", backend="numpy", workers=2)
    try:
        assert (two.epoch, two.batch_in_epoch, two.step_count) == (0, 3, 3)
        with pytest.raises(ValueError, match=r"3 of epoch 1's batches of 16 samples \(48 of 96\); a loader with "
                                             r"batch_size 16 \(now 32\) would serve other batches"):
            two.fit(gc.data.DataLoader(data, batch_size=32, seed=3), 1, progress=False, quiet=True)
        assert two.step_count == 3
        done = two.fit(gc.data.DataLoader(data, batch_size=16, seed=3), 1, progress=False, quiet=True)
        assert done.epochs[0].samples == 96 and two.step_count == 6
        one.fit(gc.data.DataLoader(data, batch_size=16, seed=3), 1, progress=False, quiet=True)
        for name, value in one.params.items():
            np.testing.assert_allclose(two.params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    finally:
        two.shutdown()
