"""The per-model server (issue 13 item 1): GPU jobs of one model hand their work to one process that
loads the weights once; results equal the in-process extraction; a failed task fails alone."""

import h5py
import numpy as np
import pytest

from llmgeom.prompts.io import write_prompt_set
from llmgeom.models import sources as models, tiny as testing
from llmgeom.workflow import model_server as ms

RECS = [{"id": "a", "text": "abc", "meta": {}}, {"id": "b", "text": "hello world", "meta": {}},
        {"id": "c", "text": "xyzzy plugh", "meta": {}}]


@pytest.fixture()
def setup(tmp_path, monkeypatch):
    src = testing.save_tiny_model_dir("llama", tmp_path / "src")
    prepared = tmp_path / "prepared"
    models.prepare_model("tiny", {"source": "hf_local", "path": str(src)}, prepared)
    p1, p2 = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    write_prompt_set(RECS, p1)
    write_prompt_set(RECS[::-1][:2], p2)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_DIR", str(tmp_path / "srv"))
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "60")
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "1")
    load = dict(model_dir=str(prepared), dtype="float32", device="cpu", device_map=None)
    yield tmp_path, prepared, (p1, p2), load
    ms.stop_server(load)


def _kw(prepared, prompts, out):
    return dict(model_dir=str(prepared), prompts_path=str(prompts), out_path=str(out), model_name="tiny",
                dtype="float32", device="cpu", batch_size=2)


def test_two_jobs_one_weight_load_same_values(setup, monkeypatch):
    tmp, prepared, (p1, p2), load = setup
    outs = [tmp / "one.h5", tmp / "two.h5"]
    logs = [tmp / "logs" / "one.log", tmp / "logs" / "two.log"]
    for p, o, lg in zip((p1, p2), outs, logs):
        ms.run_task("extract", _kw(prepared, p, o), load=load, log=str(lg), threads=1)
    assert "weights loaded for it: 1" in logs[0].read_text()
    assert "weights loaded for it: 0" in logs[1].read_text()  # the second job reused the loaded model
    assert "extract tiny two" in logs[1].read_text()  # the job's own progress lines are in its log
    # the same values as the job's own process (server off)
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER", "0")
    ref = tmp / "ref.h5"
    ms.run_task("extract", _kw(prepared, p2, ref), load=load, log=str(tmp / "logs" / "ref.log"), threads=1)
    with h5py.File(outs[1]) as a, h5py.File(ref) as b:
        for k in ("last_token/residual", "last_token/attn_output", "attention/entropy", "next_token/top_logits"):
            np.testing.assert_array_equal(a[k][()], b[k][()], err_msg=k)


def test_failed_task_fails_alone(setup):
    tmp, prepared, (p1, _), load = setup
    with pytest.raises(ms.ModelServerTaskError, match="missing.jsonl"):
        ms.run_task("extract", _kw(prepared, tmp / "missing.jsonl", tmp / "x.h5"), load=load,
                    log=str(tmp / "bad.log"), threads=1)
    assert "Traceback" in (tmp / "bad.log").read_text() and not (tmp / "x.h5").exists()
    # the server is still there and serves the next job
    assert ms.run_task("extract", _kw(prepared, p1, tmp / "ok.h5"), load=load, log=str(tmp / "ok.log"), threads=1)
    assert (tmp / "ok.h5").is_file()
    with pytest.raises(ValueError, match="unknown model-server task 'train'"):
        ms.run_task("train", {}, load=load, log=str(tmp / "t.log"))


def test_idle_setting_is_checked(monkeypatch):
    monkeypatch.setenv("LLMGEOM_MODEL_SERVER_IDLE_S", "-3")
    with pytest.raises(ValueError, match="LLMGEOM_MODEL_SERVER_IDLE_S='-3'"):
        ms.idle_seconds()
