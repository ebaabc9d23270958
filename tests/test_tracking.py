"""Experiment tracking: each tracker's output read back with its own reader.

TensorBoard through its ``EventAccumulator``, MLflow through ``MlflowClient``, W&B from the
offline run file (``WANDB_MODE=offline``; its records are read with W&B's own protobuf
classes). Every store is a temporary folder; nothing leaves the machine.
"""

import html
import importlib.util
import json
import os
import pickle
import shutil
import struct
import time
import warnings

import pytest
from _tiny import small_policy, tiny_lm

import prefopt
from prefopt import DPOPolicy, RewardModel, SFTPolicy
from prefopt.tracking import (
    MLflowLogger,
    TensorBoardLogger,
    WandbLogger,
    open_run,
    run_group,
    samples_table,
)
from prefopt.worlds import PreferenceWorld

DEMOS = [("the movie was", "good ."), ("the plot was", "great .")] * 4
COMPARISONS = [("the movie was", "good .", "bad ."), ("the plot was", "great .", "awful .")] * 4
WORLD = PreferenceWorld(random_state=0)


def _sft(**params):
    settings = dict(model=tiny_lm(), n_epochs=2, batch_size=2, random_state=0)
    return SFTPolicy(**{**settings, **params})


def _reward_model(**params):
    settings = dict(model=tiny_lm(), n_epochs=1, batch_size=2, normalize=False, random_state=0)
    return RewardModel(**{**settings, **params})


def _scalars(folder, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)], acc


def _same_points(points, history, key):
    """Steps equal, values equal to float32 (TensorBoard keeps float32)."""
    assert [s for s, _ in points] == [r["step"] for r in history]
    assert [v for _, v in points] == pytest.approx([r[key] for r in history], rel=1e-6)
    return True


def _tb_text(acc, tag):
    return [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(f"{tag}/text_summary")]


def _wandb_texts(run_folder, history, tag):
    """``{step: text}`` of the ``wandb.Html`` texts logged under ``tag``, from their files."""
    texts = {}
    for h in history:
        if f"{tag}/path" in h:
            path = os.path.join(run_folder, "files", json.loads(h[f"{tag}/path"]))
            page = open(path).read()
            texts[int(h["_step"])] = html.unescape(page[page.index("<pre>") + 5 : -len("</pre>")])
    return texts


def _wandb_records(run_folder):
    """The protobuf records of a W&B offline run file (LevelDB log blocks of 32 KiB)."""
    from wandb.proto import wandb_internal_pb2

    (name,) = [f for f in os.listdir(run_folder) if f.endswith(".wandb")]
    data = open(os.path.join(run_folder, name), "rb").read()
    assert data[:4] == b":W&B"
    pos, block, records, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # full/first, middle/last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def _wandb_run_folders(folder):
    return sorted(
        os.path.join(folder, "wandb", d)
        for d in os.listdir(os.path.join(folder, "wandb"))
        if d.startswith("offline-run-")
    )


def _wandb_runs(folder):
    out = []
    for run in _wandb_run_folders(folder):
        records = _wandb_records(run)
        for _ in range(300):  # W&B's writer process may still be flushing after finish()
            if any(r.WhichOneof("record_type") == "exit" for r in records):
                break
            time.sleep(0.1)
            records = _wandb_records(run)
        (info,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        config = {
            u.key: u.value_json for r in records if r.HasField("config") for u in r.config.update
        }
        config.update({u.key: u.value_json for u in info.config.update})
        history = []
        for r in records:
            if r.WhichOneof("record_type") == "history":
                history.append(
                    {i.key or "/".join(i.nested_key): i.value_json for i in r.history.item}
                )
        out.append((info, config, history))
    return out


# -- configuration and bad input ---------------------------------------------------------------


def test_report_to_and_logging_dir_in_config(tmp_path):
    assert prefopt.get_config()["report_to"] == ("none",)
    assert prefopt.get_config()["logging_dir"] == "./runs"
    with prefopt.config_context(report_to="tensorboard", logging_dir=tmp_path):
        assert prefopt.get_config()["report_to"] == ("tensorboard",)
        assert prefopt.get_config()["logging_dir"] == str(tmp_path)
    assert prefopt.get_config()["report_to"] == ("none",)
    with prefopt.config_context(report_to=["mlflow", "tensorboard", "mlflow"]):
        assert prefopt.get_config()["report_to"] == ("mlflow", "tensorboard")


def test_bad_report_to_and_logging_dir_are_clear_errors(monkeypatch):
    with pytest.raises(ValueError, match="Unknown report_to 'tensorbord': choose from"):
        prefopt.set_config(report_to=["tensorbord"])
    with pytest.raises(ValueError, match="names 'none' with trackers"):
        prefopt.set_config(report_to=["none", "mlflow"])
    with pytest.raises(ValueError, match="a tracker name or a list"):
        prefopt.set_config(report_to=3)
    with pytest.raises(ValueError, match="logging_dir must be a folder path"):
        prefopt.set_config(logging_dir="")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"pip install 'prefopt\[wandb\]'"):
        prefopt.set_config(report_to="wandb")
    with pytest.raises(ImportError, match=r"pip install 'prefopt\[wandb\]'"):
        _reward_model().fit(COMPARISONS, callback=WandbLogger())
    assert prefopt.get_config()["report_to"] == ("none",)  # nothing was half-set


def test_unwritable_logging_folder_fails_before_training(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    sft = _sft()
    with prefopt.config_context(report_to="tensorboard", logging_dir=blocker / "runs"):
        with pytest.raises(PermissionError, match="logging folder .* cannot be written"):
            sft.fit(DEMOS)
    assert sft.history_ == [] and sft.n_iter_ == 0  # no step was taken
    with pytest.raises(PermissionError, match="cannot be written"):
        _reward_model().fit(COMPARISONS, callback=TensorBoardLogger(blocker / "tb"))


def test_bad_callback_is_a_type_error():
    with pytest.raises(TypeError, match="callback must be a callable"):
        _reward_model().fit(COMPARISONS, callback="tensorboard")
    with pytest.raises(TypeError, match="callback must be a callable"):
        _reward_model().fit(COMPARISONS, callback=[print, 3])


# -- the callback and verbose ------------------------------------------------------------------


def test_reward_model_callback_sees_every_row_and_can_stop():
    seen = []
    rm = _reward_model(n_epochs=2).fit(COMPARISONS, callback=lambda est, row: seen.append(row))
    assert len(seen) == 8 and seen == rm.history_  # 8 comparisons / 2 a step, 2 epochs
    rm = _reward_model(n_epochs=2).fit(COMPARISONS, callback=lambda est, row: row["step"] == 3)
    assert rm.n_iter_ == 3 and [r["step"] for r in rm.history_] == [1, 2, 3]


def test_verbose_prints_a_line_per_logging_step(capsys):
    _sft(n_epochs=6, verbose=1).fit(DEMOS)  # 24 steps: lines at 10, 20 and the last
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "SFTPolicy step 10/24",
        "SFTPolicy step 20/24",
        "SFTPolicy step 24/24",
    ]
    assert lines[0].split(": ")[1].startswith("loss/sft ")
    _sft(n_epochs=1, verbose=2).fit(DEMOS)
    assert len(capsys.readouterr().out.splitlines()) == 4
    _sft(n_epochs=1).fit(DEMOS)
    assert capsys.readouterr().out == ""


# -- TensorBoard -------------------------------------------------------------------------------


def test_tensorboard_from_report_to_reads_back(tmp_path):
    with prefopt.config_context(report_to="tensorboard", logging_dir=tmp_path):
        sft = _sft().fit(DEMOS)
    (run,) = os.listdir(tmp_path)
    assert run.startswith("SFTPolicy_")
    points, acc = _scalars(tmp_path / run, "loss/sft")
    assert _same_points(points, sft.history_, "loss/sft")
    assert [s for s, _ in points] == list(range(1, 9))  # one point per step
    (params,) = _tb_text(acc, "parameters")
    assert "| n_epochs | 2 |" in params and "| batch_size | 2 |" in params


def test_tensorboard_logger_as_callback_and_samples(tmp_path):
    logger = TensorBoardLogger(tmp_path / "rm")
    rm = _reward_model().fit(COMPARISONS, callback=logger)
    points, acc = _scalars(tmp_path / "rm", "reward/accuracy")
    assert _same_points(points, rm.history_, "reward/accuracy")
    # What a policy loop logs every samples_every steps:
    logger.start(rm, run_name="samples")
    logger.log_samples(["the movie was"], ["good ."], step=10, rewards=[0.5])
    logger.close()
    _, acc = _scalars(tmp_path / "rm", "reward/accuracy")
    assert _tb_text(acc, "samples/completions") == [
        samples_table(["the movie was"], ["good ."], [0.5])
    ]


@pytest.mark.parametrize("tracker", ["TensorBoard", "MLflow", "W&B"])
def test_tracker_failing_mid_run_warns_once_and_the_fit_goes_on(tmp_path, tracker, monkeypatch):
    folder = tmp_path / "gone"
    if tracker == "TensorBoard":
        logger = TensorBoardLogger(folder)
    elif tracker == "MLflow":
        folder.mkdir()
        logger = MLflowLogger(f"sqlite:///{folder / 'store.db'}")
    else:
        monkeypatch.setenv("WANDB_MODE", "offline")
        logger = WandbLogger(dir=folder)

    def remove_folder(est, row):
        if row["step"] == 2:
            shutil.rmtree(folder)

    with pytest.warns(RuntimeWarning, match=f"{tracker} logging failed") as caught:
        rm = _reward_model(n_epochs=2).fit(COMPARISONS, callback=[logger, remove_folder])
    assert len([w for w in caught if "logging failed" in str(w.message)]) == 1
    assert [r["step"] for r in rm.history_] == list(range(1, 9))  # nothing lost
    assert all(set(r) >= {"loss/reward", "reward/accuracy"} for r in rm.history_)
    assert not folder.exists()  # ending the failed run made nothing anew


# -- MLflow ------------------------------------------------------------------------------------


def test_mlflow_run_reads_back_with_mlflow_client(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    logger = MLflowLogger(uri, experiment_name="rm")
    rm = _reward_model().fit(COMPARISONS, callback=logger)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id_)
    assert run.info.status == "FINISHED"
    assert run.data.params["batch_size"] == "2" and run.data.params["normalize"] == "False"
    history = client.get_metric_history(logger.run_id_, "loss/reward")
    points = sorted((m.step, m.value) for m in history)
    assert _same_points(points, rm.history_, "loss/reward")
    assert [m.step for m in sorted(history, key=lambda m: m.step)] == [1, 2, 3, 4]


def test_mlflow_honours_mlflow_tracking_uri(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with prefopt.config_context(report_to="mlflow", logging_dir=tmp_path / "runs"):
        sft = _sft().fit(DEMOS)
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("prefopt").experiment_id])
    assert run.data.params["n_epochs"] == "2"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss/sft")]
    assert sorted(steps) == [r["step"] for r in sft.history_] == list(range(1, 9))
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # the variable's store, not ours


# -- W&B ---------------------------------------------------------------------------------------


def test_wandb_offline_run_files_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    data = WORLD.comparisons(64, random_state=0)
    with prefopt.config_context(report_to="wandb", logging_dir=tmp_path):
        dpo = DPOPolicy(beta=0.5, batch_size=16, n_epochs=1, random_state=0).fit(data)
    ((info, config, history),) = _wandb_runs(tmp_path)
    assert info.display_name.startswith("DPOPolicy_")
    assert config["beta"] == "0.5" and config["batch_size"] == "16"
    steps = [int(h["_step"]) for h in history if "loss/dpo" in h]
    losses = [float(h["loss/dpo"]) for h in history if "loss/dpo" in h]
    assert steps == [1, 2, 3, 4]
    assert losses == pytest.approx([r["loss/dpo"] for r in dpo.history_])


def test_wandb_failing_mid_run_warns_once_and_keeps_what_it_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = WandbLogger(dir=tmp_path)
    calls = []

    def wandb_down(*args, **kwargs):
        calls.append(kwargs.get("step"))
        raise ConnectionError("W&B cannot be reached")

    def break_wandb(est, row):  # after the logger has logged step 1
        if row["step"] == 1:
            monkeypatch.setattr(logger.run_, "log", wandb_down)

    with pytest.warns(RuntimeWarning, match=r"W&B logging failed \(ConnectionError") as caught:
        rm = _reward_model(n_epochs=2).fit(COMPARISONS, callback=[logger, break_wandb])
    assert len([w for w in caught if "logging failed" in str(w.message)]) == 1
    assert calls == [2]  # W&B is not called again after its first failure
    assert [r["step"] for r in rm.history_] == list(range(1, 9))  # nothing lost
    assert not logger._open
    # The run still ends with the fit (quietly), so its file holds step 1 and its exit now,
    # not only when the interpreter exits.
    ((_, config, history),) = _wandb_runs(tmp_path)  # waits for W&B's writer to flush
    (run,) = _wandb_run_folders(tmp_path)
    assert any(r.WhichOneof("record_type") == "exit" for r in _wandb_records(run))
    assert config["n_epochs"] == "2"
    points = [(int(h["_step"]), float(h["loss/reward"])) for h in history if "loss/reward" in h]
    assert _same_points(points, rm.history_[:1], "loss/reward")


def test_policy_fit_under_report_to_wandb_logs_params_once_and_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    rm = _world_reward()
    with prefopt.config_context(report_to=["wandb"], logging_dir=tmp_path):
        rloo = _rloo().fit(WORLD.prompts, rm)
    (run,) = _wandb_run_folders(tmp_path)
    ((info, config, history),) = _wandb_runs(tmp_path)
    assert info.display_name.startswith("RLOOPolicy_") and info.run_group == ""
    assert config["k"] == "2" and config["n_steps"] == "4" and config["beta"] == "0.05"
    records = _wandb_records(run)
    updates = [u for r in records if r.HasField("config") for u in r.config.update]
    updates += [
        u for r in records if r.WhichOneof("record_type") == "run" for u in r.run.config.update
    ]
    assert [u.key for u in updates].count("k") == 1  # the parameters, once
    points = [
        (int(h["_step"]), float(h["objective/reward"])) for h in history if "objective/reward" in h
    ]
    assert _same_points(points, rloo.history_, "objective/reward")
    assert [s for s, _ in points] == [1, 2, 3, 4]  # one point per step
    assert not any("samples/completions/path" in h for h in history)  # default: every 10


# -- groups: one run per candidate and seed ----------------------------------------------------


def test_group_of_two_candidates_by_two_seeds(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data = WORLD.comparisons(32, random_state=0)
    with prefopt.config_context(report_to=["tensorboard", "mlflow", "wandb"], logging_dir=tmp_path):
        with run_group("search") as group:
            for beta in (0.1, 0.5):
                for seed in (0, 1):
                    # What a worker process gets: the group, pickled (its parent run id too).
                    worker_group = pickle.loads(pickle.dumps(group))
                    with worker_group.member(f"beta={beta}-seed={seed}"):
                        DPOPolicy(beta=beta, batch_size=16, random_state=seed).fit(data)
    names = sorted(f"beta={b}-seed={s}" for b in (0.1, 0.5) for s in (0, 1))
    assert sorted(os.listdir(tmp_path / "search")) == names  # TensorBoard subfolders
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("prefopt").experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == "search"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == names and len(runs) == 5
    assert {r.data.params["beta"] for r in children} == {"0.1", "0.5"}
    assert parent.info.status == "FINISHED"
    wandb_runs = _wandb_runs(tmp_path)
    assert sorted(info.display_name for info, _, _ in wandb_runs) == names
    assert {info.run_group for info, _, _ in wandb_runs} == {"search"}


def test_open_run_calls_plain_callbacks_and_opens_loggers(tmp_path):
    calls = []
    logger = TensorBoardLogger(tmp_path)
    with open_run(WORLD, callback=[logger, lambda est, row: calls.append(row["step"])]) as run:
        assert logger._open  # opened before the first step
        assert run(None, {"step": 1, "loss/x": 1.0}) is False
        assert run.samples_due(10) and not run.samples_due(3)
    assert calls == [1] and not logger._open
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a closed logger ignores further rows quietly
        logger.log_row({"step": 2, "loss/x": 0.0})


def test_policy_callback_hook_logs_objective_reward_per_step(tmp_path):
    # A logger passed as the policies' callback= is opened before the first step.
    from prefopt import RLOOPolicy

    rm = RewardModel().fit(WORLD.comparisons(200, random_state=0))
    logger = TensorBoardLogger(tmp_path)
    rloo = small_policy(WORLD, RLOOPolicy, k=2, learning_rate=0.3, n_steps=4, random_state=0).fit(
        WORLD.prompts, rm, callback=logger
    )
    logger.close()
    points, acc = _scalars(tmp_path, "objective/reward")
    assert _same_points(points, rloo.history_, "objective/reward")
    (params,) = _tb_text(acc, "parameters")
    assert "| k | 2 |" in params and "| n_steps | 4 |" in params


# -- every fit: SFT/DPO callbacks, the policy loop, searches and comparisons -------------------


def _rloo(**params):
    settings = dict(k=2, learning_rate=0.3, n_steps=4, batch_size=8, random_state=0)
    return small_policy(WORLD, **{**settings, **params})


def _world_reward():
    return RewardModel(random_state=0).fit(WORLD.comparisons(200, random_state=0))


def test_sft_and_dpo_callbacks_see_every_row_and_can_stop():
    seen = []
    sft = _sft().fit(DEMOS, callback=lambda est, row: seen.append(row))
    assert len(seen) == 8 and seen == sft.history_  # 8 demonstrations / 2 a step, 2 epochs
    sft = _sft().fit(DEMOS, callback=lambda est, row: row["step"] == 3)
    assert sft.n_iter_ == 3 and [r["step"] for r in sft.history_] == [1, 2, 3]
    data = WORLD.comparisons(64, random_state=0)
    dpo = DPOPolicy(batch_size=16, n_epochs=1, random_state=0)
    dpo.fit(data, callback=lambda est, row: row["step"] == 2)
    assert [r["step"] for r in dpo.history_] == [1, 2]
    for estimator, X in ((_sft(), DEMOS), (dpo, data)):
        with pytest.raises(TypeError, match="callback must be a callable"):
            estimator.fit(X, callback="tensorboard")


def test_dpo_mlflow_logger_as_callback_is_finished_with_the_fit(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    logger = MLflowLogger(uri, experiment_name="dpo")
    dpo = DPOPolicy(beta=0.5, batch_size=16, n_epochs=1, random_state=0)
    dpo.fit(WORLD.comparisons(64, random_state=0), callback=logger)
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(logger.run_id_).info.status == "FINISHED"
    points = sorted(
        (m.step, m.value) for m in client.get_metric_history(logger.run_id_, "loss/dpo")
    )
    assert _same_points(points, dpo.history_, "loss/dpo")


def test_policy_fit_under_report_to_logs_every_step_and_samples(tmp_path):
    rm = _world_reward()
    logger = TensorBoardLogger(tmp_path / "cb", samples_every=2)
    with prefopt.config_context(report_to="tensorboard", logging_dir=tmp_path / "runs"):
        rloo = _rloo().fit(WORLD.prompts, rm, callback=logger)
    assert not logger._open  # closed with the fit, not left to the caller
    (run,) = os.listdir(tmp_path / "runs")
    assert run.startswith("RLOOPolicy_")
    for folder in (tmp_path / "runs" / run, tmp_path / "cb"):
        points, acc = _scalars(folder, "objective/reward")
        assert _same_points(points, rloo.history_, "objective/reward")
        assert [s for s, _ in points] == [1, 2, 3, 4]  # one point per step
        (params,) = _tb_text(acc, "parameters")
        assert "| k | 2 |" in params and "| n_steps | 4 |" in params
    # Text samples: at steps 2 and 4 for samples_every=2, none in 4 steps for the default 10.
    _, acc = _scalars(tmp_path / "cb", "objective/reward")
    tables = _tb_text(acc, "samples/completions")
    assert len(tables) == 2
    lines = tables[0].splitlines()
    assert lines[0] == "| prompt | completion | reward |" and len(lines) == 2 + 8
    assert {line.split(" | ")[0][2:] for line in lines[2:]} <= set(WORLD.prompts)
    _, acc = _scalars(tmp_path / "runs" / run, "objective/reward")
    assert "samples/completions/text_summary" not in acc.Tags()["tensors"]


def test_policy_mlflow_logger_as_callback_is_finished(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store.db'}"
    logger = MLflowLogger(uri, experiment_name="rloo")
    rloo = _rloo().fit(WORLD.prompts, _world_reward(), callback=logger)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logger.run_id_)
    assert run.info.status == "FINISHED" and run.data.params["k"] == "2"
    history = client.get_metric_history(logger.run_id_, "objective/reward")
    points = sorted((m.step, m.value) for m in history)
    assert _same_points(points, rloo.history_, "objective/reward")


def test_policy_verbose_prints_a_line_per_logging_step(capsys):
    rm = _world_reward()
    capsys.readouterr()
    _rloo(n_steps=12, verbose=1).fit(WORLD.prompts, rm)
    lines = capsys.readouterr().out.splitlines()
    # First the length of a response and where it comes from, then the steps.
    assert lines[0].startswith("RLOOPolicy: sampling up to 1 new tokens per response (")
    lines = lines[1:]
    assert [line.split(":")[0] for line in lines] == [
        "RLOOPolicy step 10/12",
        "RLOOPolicy step 12/12",
    ]
    assert lines[0].split(": ")[1].startswith("objective/reward ")
    _rloo(n_steps=3, verbose=2).fit(WORLD.prompts, rm)
    assert len(capsys.readouterr().out.splitlines()) == 1 + 3
    _rloo(n_steps=3).fit(WORLD.prompts, rm)
    assert capsys.readouterr().out == ""


def test_seed_search_is_one_nested_run_per_candidate_and_seed(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from prefopt.model_selection import SeedSearchCV

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rm = _world_reward()
    search = SeedSearchCV(_rloo(n_steps=2), {"beta": [0.1, 0.5]}, seeds=[0, 1], refit=False)
    with prefopt.config_context(report_to=["mlflow", "tensorboard"], logging_dir=tmp_path):
        search.fit(WORLD.prompts, reward_model=rm)
    names = sorted(f"candidate={c}-seed={s}" for c in (0, 1) for s in (0, 1))
    (group,) = [f for f in os.listdir(tmp_path) if f != "mlflow.db"]
    assert group.startswith("SeedSearchCV_")
    assert sorted(os.listdir(tmp_path / group)) == names  # <logging_dir>/<group>/<run>
    points, _ = _scalars(tmp_path / group / "candidate=1-seed=0", "objective/reward")
    assert [s for s, _ in points] == [1, 2]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("prefopt").experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == group]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == names and len(runs) == 5
    by_name = {r.info.run_name: r for r in children}
    assert by_name["candidate=1-seed=0"].data.params["beta"] == "0.5"
    assert by_name["candidate=0-seed=1"].data.params["random_state"] == "1"
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_seed_search_with_wandb_is_one_run_per_candidate_and_seed_in_one_group(
    tmp_path, monkeypatch
):
    from prefopt.model_selection import SeedSearchCV

    monkeypatch.setenv("WANDB_MODE", "offline")
    rm = _world_reward()
    search = SeedSearchCV(_rloo(n_steps=2), {"beta": [0.1, 0.5]}, seeds=[0, 1], refit=False)
    with prefopt.config_context(report_to=["wandb"], logging_dir=tmp_path):
        search.fit(WORLD.prompts, reward_model=rm)
    assert os.listdir(tmp_path) == ["wandb"]  # W&B alone
    runs = _wandb_runs(tmp_path)
    names = sorted(f"candidate={c}-seed={s}" for c in (0, 1) for s in (0, 1))
    assert sorted(info.display_name for info, _, _ in runs) == names
    (group,) = {info.run_group for info, _, _ in runs}
    assert group.startswith("SeedSearchCV_")
    by_name = {info.display_name: (config, history) for info, config, history in runs}
    assert by_name["candidate=1-seed=0"][0]["beta"] == "0.5"
    assert by_name["candidate=0-seed=1"][0]["random_state"] == "1"
    for _, history in by_name.values():
        assert [int(h["_step"]) for h in history if "objective/reward" in h] == [1, 2]


def test_text_samples_reach_mlflow_and_wandb(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    tensorboard = TensorBoardLogger(tmp_path / "tb", samples_every=2)
    mlflow = MLflowLogger(uri, experiment_name="samples", samples_every=2)
    wandb = WandbLogger(dir=tmp_path, samples_every=2)
    _rloo().fit(WORLD.prompts, _world_reward(), callback=[tensorboard, mlflow, wandb])
    _, acc = _scalars(tmp_path / "tb", "objective/reward")
    tables = _tb_text(acc, "samples/completions")  # steps 2 and 4, as TensorBoard has them
    assert len(tables) == 2
    lines = tables[0].splitlines()
    assert lines[0] == "| prompt | completion | reward |" and len(lines) == 2 + 8
    assert {line.split(" | ")[0][2:] for line in lines[2:]} <= set(WORLD.prompts)
    # MLflow: a Markdown artifact a sample.
    client = MlflowClient(tracking_uri=uri)
    paths = sorted(a.path for a in client.list_artifacts(mlflow.run_id_, "samples/completions"))
    assert paths == [f"samples/completions/step_00000{s}.md" for s in (2, 4)]
    (tmp_path / "download").mkdir()
    downloaded = [
        client.download_artifacts(mlflow.run_id_, p, str(tmp_path / "download")) for p in paths
    ]
    assert [open(path).read() for path in downloaded] == tables
    # W&B: a wandb.Html page a sample, in the offline run's media files.
    (run,) = _wandb_run_folders(tmp_path)
    ((_, _, history),) = _wandb_runs(tmp_path)
    assert _wandb_texts(run, history, "samples/completions") == {2: tables[0], 4: tables[1]}


def test_search_and_compare_without_report_to_log_nothing(tmp_path):
    from prefopt.model_selection import SeedSearchCV, compare

    rm = _world_reward()
    with prefopt.config_context(logging_dir=tmp_path):  # report_to="none", the default
        SeedSearchCV(_rloo(n_steps=1), {"beta": [0.1]}, seeds=[0], refit=False).fit(
            WORLD.prompts, reward_model=rm
        )
        compare({"RLOO": _rloo(n_steps=1)}, WORLD.prompts, reward_model=rm, seeds=[0])
    assert os.listdir(tmp_path) == []


def test_compare_is_one_run_per_algorithm_and_seed(tmp_path):
    from prefopt.model_selection import compare

    rm = _world_reward()
    algorithms = {"RLOO": _rloo(n_steps=2), "RLOO-b": _rloo(n_steps=2, beta=0.5)}
    with prefopt.config_context(report_to="tensorboard", logging_dir=tmp_path):
        compare(algorithms, WORLD.prompts, reward_model=rm, seeds=[0, 1])
    (group,) = os.listdir(tmp_path)
    assert group.startswith("compare_")
    names = sorted(f"{a}-seed={s}" for a in algorithms for s in (0, 1))
    assert sorted(os.listdir(tmp_path / group)) == names
    points, _ = _scalars(tmp_path / group / "RLOO-b-seed=1", "objective/reward")
    assert [s for s, _ in points] == [1, 2]


def test_seed_search_evaluation_and_refit_runs_join_the_group(tmp_path):
    from prefopt.model_selection import SeedSearchCV

    rm = _world_reward()
    search = SeedSearchCV(_rloo(n_steps=1), {"beta": [0.1]}, seeds=[0], evaluation_seeds=1)
    with prefopt.config_context(report_to="tensorboard", logging_dir=tmp_path):
        search.fit(WORLD.prompts, reward_model=rm)
    (group,) = os.listdir(tmp_path)
    (seed,) = search.evaluation_seeds_
    assert sorted(os.listdir(tmp_path / group)) == [
        "candidate=0-seed=0",
        f"evaluation-seed={seed}",
        f"refit-seed={seed}",
    ]


def test_one_fit_has_one_run_name_in_every_tracker(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with prefopt.config_context(report_to=["tensorboard", "mlflow"], logging_dir=tmp_path):
        _sft().fit(DEMOS)
    (folder,) = [f for f in os.listdir(tmp_path) if f not in ("mlflow.db", "mlartifacts")]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("prefopt").experiment_id])
    assert folder.startswith("SFTPolicy_")
    assert run.info.run_name == folder  # TensorBoard's folder, MLflow's run: one name
