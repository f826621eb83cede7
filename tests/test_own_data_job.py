"""Bring your own data: a CSV with string columns trained from a YAML job alone
(``embeddb train``), its mistakes reported before anything starts, and the data loader that
streams each rank's disjoint part of the file."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from click.testing import CliRunner

from embeddb.cli import main as cli
from embeddb.errors import CorruptDataError
from embeddb.features.batch import (
    Batch,
    IDTypeFeature,
    IDTypeFeatureWithSingleID,
    Label,
    NonIDTypeFeature,
)
from embeddb.features.pipeline import PIPELINE_FILE, save_pipeline
from embeddb.trainer.launcher.job import JobConfig
from embeddb.trainer.launcher.loader import (
    BATCH,
    DONE,
    END,
    ERROR,
    BatchStream,
    decode_batch,
    encode_batch,
    loader_command,
    read_frame,
    write_frame,
)

ROOT = Path(__file__).resolve().parents[1]
CLICKS = ROOT / "examples" / "clicks"

JOB = """\
dataset:
  format: csv
  train: data/train.csv
  test: data/test.csv
  label: {column: clicked}
  ids: [user, item, city, device, {column: tags, separator: "|"}]
  numeric: [{column: price, transform: log1p}, {column: age, transform: standardize}]
model: builtin:deepfm
embedding_config: auto
embedding_dim: 8
epochs: 2
batch_size: 256
optimizer: {type: adam, lr: 0.003}
seed: 0
"""


def make_data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clicks_make_data", CLICKS / "make_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def clicks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with data/train.csv (24,000 rows) and data/test.csv (6,000)."""
    folder = tmp_path_factory.mktemp("clicks")
    make_data().make(folder / "data", 30_000, seed=3)
    return folder


def write_job(folder: Path, text: str = JOB, name: str = "job.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------ mistakes
def line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("ids: [user,", "ids: [usr,"), ("usr", "ids: [usr,")),
        (("format: csv", "format: xls"), ("format", "format: xls")),
        (("model: builtin:deepfm", "model: builtin:dnnn"), ("dnnn", "model: builtin:dnnn")),
        (("model: builtin:deepfm", "model: model.py:Typo"), ("Typo", "model: model.py:Typo")),
        (("epochs: 2", "epochs: 0"), ("epochs", "epochs: 0")),
    ],
)
def test_a_mistake_in_the_job_names_key_and_line_before_anything_starts(
    clicks: Path, tmp_path: Path, change: tuple[str, str], expected: tuple[str, str]
) -> None:
    (tmp_path / "data").symlink_to(clicks / "data")
    (tmp_path / "model.py").write_text("from torch import nn\nclass Model(nn.Module):\n    pass\n")
    text = JOB.replace(*change)
    job = write_job(tmp_path, text)
    result = CliRunner().invoke(cli, ["train", str(job)])
    assert result.exit_code == 1, result.output
    word, needle = expected
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and word in errors[0], result.output
    assert f"job.yaml:{line_of(text, needle)}" in errors[0], result.output
    assert "samples/s" not in result.output  # nothing trained
    if needle.startswith("model: model.py"):  # the held rank checks the model (shards up)
        assert result.output.rstrip().splitlines()[-1] == errors[0], result.output
    else:  # the job file or the data: nothing started
        assert result.output.startswith("Error: "), result.output
        assert "shards:" not in result.output and "NN worker" not in result.output


@pytest.mark.slow
def test_an_unparsable_value_names_its_true_line(clicks: Path, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    lines = (clicks / "data" / "train.csv").read_text().splitlines(keepends=True)[:2000]
    fields = lines[1234].split(",")
    fields[5] = "12.5e"  # price: not a number, on line 1235 of the file (the header is 1)
    lines[1234] = ",".join(fields)
    (tmp_path / "data" / "train.csv").write_text("".join(lines))
    (tmp_path / "data" / "test.csv").write_text((clicks / "data" / "test.csv").read_text())
    result = CliRunner().invoke(cli, ["train", str(write_job(tmp_path))])
    assert result.exit_code == 1, result.output
    assert "train.csv:1235" in result.output and "price" in result.output, result.output
    assert "shards:" not in result.output


def test_the_job_file_records_where_each_key_is(clicks: Path) -> None:
    job = JobConfig.from_yaml(write_job(clicks))
    assert job.where("epochs").endswith(f"job.yaml:{line_of(JOB, 'epochs:')}")
    assert job.where("dataset.ids[4]").endswith(f":{line_of(JOB, 'ids:')}")
    assert job.where("dataset.label.column").endswith(f":{line_of(JOB, 'label:')}")
    assert job.builtin_model == "deepfm" and job.auto_embedding and job.embedding_dim == 8


# ------------------------------------------------------------------------------ the loader
def test_frames_carry_ragged_and_single_ids_numeric_features_and_labels() -> None:
    batch = Batch(
        [
            IDTypeFeatureWithSingleID("user", np.array([5, 6, 7], dtype=np.uint64)),
            IDTypeFeature("tags", [[1, 2], [], [2**63 + 5]]),
        ],
        [NonIDTypeFeature(np.arange(6, dtype=np.float32).reshape(3, 2), name="price")],
        [Label(np.array([[1.0], [0.0], [1.0]], dtype=np.float32), name="clicked")],
    )
    out = io.BytesIO()
    write_frame(out, BATCH, encode_batch(batch))
    write_frame(out, END)
    out.seek(0)
    frame = read_frame(out)
    assert frame is not None and frame[0] == BATCH
    back = decode_batch(frame[1])
    assert [f.name for f in back.id_type_features] == ["user", "tags"]
    assert back.feature("user").single_id and back.feature("user").values.tolist() == [5, 6, 7]
    tags = back.feature("tags")
    assert tags.offsets.tolist() == [0, 2, 2, 3] and tags.values.tolist() == [1, 2, 2**63 + 5]
    assert np.array_equal(back.non_id_type_features[0].data, batch.non_id_type_features[0].data)
    assert back.labels[0].name == "clicked" and back.labels[0].data.ravel().tolist() == [1, 0, 1]
    assert read_frame(out) == (END, bytearray())
    assert read_frame(out) is None


@pytest.mark.slow
def test_an_error_frame_is_raised_by_the_rank_with_its_place() -> None:
    fake_loader = (
        "import sys\n"
        "from embeddb.trainer.launcher.loader import ERROR, write_frame\n"
        "write_frame(sys.stdout.buffer, ERROR, [b'CorruptDataError\\tdata.csv:17: bad'])\n"
    )
    with (
        BatchStream([sys.executable, "-c", fake_loader]) as stream,
        pytest.raises(CorruptDataError, match=r"data\.csv:17: bad"),
    ):
        list(stream.epoch())


PARTITION_JOB = """\
dataset:
  format: csv
  train: rows.csv
  split: {fraction: 0.25}
  label: {column: y}
  ids: [{column: row, kind: int}, key]
  shuffle: {buffer_rows: 500}
model: builtin:dnn
"""


def loader_ids(job: Path, run_dir: Path, rank: int, world: int, epochs: int) -> list[list[int]]:
    """Every row id a loader of ``rank`` streams, per epoch."""
    command = loader_command(job, run_dir, rank=rank, world=world, epochs=(0, epochs),
                             batch_size=128)  # fmt: skip
    result = subprocess.run(command, capture_output=True, cwd=ROOT, check=True)
    source = io.BytesIO(result.stdout)
    per_epoch: list[list[int]] = [[]]
    while (frame := read_frame(source)) is not None:
        kind, payload = frame
        assert kind != ERROR, payload
        if kind == BATCH:
            per_epoch[-1] += decode_batch(payload).feature("row").values.tolist()
        elif kind == END:
            per_epoch.append([])
        else:
            assert kind == DONE
    assert per_epoch[-1] == []
    return per_epoch[:-1]


@pytest.mark.slow
def test_two_ranks_stream_disjoint_parts_covering_every_train_row_once(tmp_path: Path) -> None:
    rows = 5_000
    keys = np.random.default_rng(0).integers(0, 50, rows)
    text = "row,key,y\n" + "".join(f"{i},k{k},{i % 2}\n" for i, k in enumerate(keys.tolist()))
    (tmp_path / "rows.csv").write_text(text)
    job_path = write_job(tmp_path, PARTITION_JOB)
    job = JobConfig.from_yaml(job_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_pipeline(job.dataset_spec.fit(), run_dir / PIPELINE_FILE)
    ranks = [loader_ids(job_path, run_dir, rank, 2, epochs=2) for rank in (0, 1)]
    first = [set(r[0]) for r in ranks]
    assert not first[0] & first[1]  # disjoint
    train = first[0] | first[1]
    assert sum(len(r[0]) for r in ranks) == len(train)  # each row once
    assert 0.7 * rows < len(train) < 0.8 * rows  # the test fraction is held out
    assert min(len(f) for f in first) > 0.4 * len(train)  # both ranks have a fair part
    for epochs in ranks:  # every epoch the same rows, in another (shuffled) order
        assert sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]
    test = {
        int(i)
        for b in job.dataset_spec.reader(job.dataset_spec.fit(), "test", 1000, train=False)
        for i in b.feature("row").values
    }
    assert not test & train and len(test | train) == rows


@pytest.mark.slow
def test_the_loader_never_imports_torch(clicks: Path, tmp_path: Path) -> None:
    (tmp_path / "data").symlink_to(clicks / "data")
    job_path = write_job(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_pipeline(JobConfig.from_yaml(job_path).dataset_spec.fit(), run_dir / PIPELINE_FILE)
    code = (
        "import io, sys\n"
        "from pathlib import Path\n"
        "from embeddb.trainer.launcher.job import JobConfig\n"
        "from embeddb.trainer.launcher.loader import run_loader\n"
        f"job = JobConfig.from_yaml({str(job_path)!r})\n"
        f"run_loader(job, Path({str(run_dir)!r}), io.BytesIO(), rank=0, world=1, "
        "epochs=(0, 1), batch_size=512)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


# ------------------------------------------------------------------------------ end to end
def plain_pytorch_auc(job: JobConfig, buckets: int = 1 << 16) -> float:
    """The same model (builtin:deepfm) trained in plain PyTorch on the same batches: one
    ``nn.EmbeddingBag`` per ID feature over the same hashed ids (modulo ``buckets``),
    Adagrad lr 0.05 on the embeddings (the shards' optimizer), the job's dense optimizer."""
    import torch
    from torch import nn

    from embeddb.common.evaluation import auc
    from embeddb.trainer.models import build_model

    torch.manual_seed(job.seed)
    pipeline = job.dataset_spec.fit()
    dim = job.embedding_dim
    model = build_model("deepfm", id_dims=[dim] * len(pipeline.id_features),
                        non_id_widths=[w for _, w in pipeline.non_id])  # fmt: skip
    bags = nn.ModuleList(nn.EmbeddingBag(buckets, dim, mode="sum", sparse=True)
                         for _ in pipeline.id_features)  # fmt: skip
    for bag in bags:
        nn.init.normal_(bag.weight, 0.0, 0.05)
    dense = torch.optim.Adam(model.parameters(), lr=job.optimizer["lr"])
    sparse = torch.optim.Adagrad(bags.parameters(), lr=0.05, initial_accumulator_value=0.01)
    loss_fn = nn.BCEWithLogitsLoss()

    def run(batch: Batch) -> torch.Tensor:
        embeddings = []
        for bag, f in zip(bags, batch.id_type_features, strict=True):
            ids = torch.from_numpy((f.values % np.uint64(buckets)).astype(np.int64))
            embeddings.append(bag(ids, torch.from_numpy(f.offsets[:-1].copy())))
        non_id = [torch.from_numpy(np.array(d.data)) for d in batch.non_id_type_features]
        out: torch.Tensor = model(non_id, embeddings)
        return out

    for epoch in range(job.epochs):
        reader = job.dataset_spec.reader(pipeline, "train", job.batch_size, train=True,
                                         epoch=epoch, seed=job.seed)  # fmt: skip
        for batch in reader:
            loss = loss_fn(run(batch), torch.from_numpy(np.array(batch.labels[0].data)))
            dense.zero_grad()
            sparse.zero_grad()
            loss.backward()
            dense.step()
            sparse.step()
    scores, labels = [], []
    with torch.no_grad():
        for batch in job.dataset_spec.reader(pipeline, "test", 4096, train=False):
            scores.append(run(batch).numpy().ravel())
            labels.append(np.asarray(batch.labels[0].data).ravel())
    return auc(labels=np.concatenate(labels), scores=np.concatenate(scores))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch's Adagrad
def test_a_csv_with_string_columns_trains_from_the_job_alone_to_a_pytorch_level_auc(
    clicks: Path,
) -> None:
    job_path = write_job(clicks)
    result = subprocess.run(
        [sys.executable, "-m", "embeddb.cli", "train", str(job_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "features: ids user, item, city, device, tags; numeric price, age" in out
    assert "shards:" in out and "test AUC" in out
    trained = float(out.split("test AUC ")[1].split()[0])
    baseline = plain_pytorch_auc(JobConfig.from_yaml(job_path))
    assert trained > 0.7, out
    assert abs(trained - baseline) <= 0.02, (trained, baseline)
