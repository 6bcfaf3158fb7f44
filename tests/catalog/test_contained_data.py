"""Every file a dataset or a saved model opens stays inside its data_root (issue 25, item 2).

A symlink (or a path written in the data) that leaves data_root is refused before anything is
read, for every kind: imagefolder, files (data files, tokenizer, image paths in a column),
hf_disk (its files and the files its JSON names), the torchvision datasets, `hf:<directory>`.
And no refusal quotes the file: the secret's text appears in no message nor traceback.
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest

from services.catalog.build import build_dataset, build_model
from services.catalog.contained import OutsideDataRoot
from tests.own_data_files import make_image_folder, train_tokenizer, write_text

pytestmark = pytest.mark.usefixtures("one_intra_op_thread")
SECRET = "AWS_SECRET_ACCESS_KEY=never-shown-7f3a"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Another owner's directory, beside the data_root: a secret in csv, json and text form."""
    other = tmp_path / "alice"
    other.mkdir()
    (other / "secret.csv").write_text(f"a,b\n{SECRET},1\n")
    (other / "secret.jsonl").write_text(json.dumps({"body": SECRET, "id": "1"}) + "\n")
    return other


@pytest.fixture
def root(tmp_path: Path) -> Path:
    own = tmp_path / "bob"
    own.mkdir()
    return own


def refused(error: pytest.ExceptionInfo[BaseException], shown: str) -> None:
    """The refusal names the path as the owner wrote it and says what to do; neither its
    message nor its traceback (what the worker's `traceback` event holds) quotes the secret."""
    assert error.type is OutsideDataRoot
    assert f"{shown!r} leads outside data_root" in str(error.value) and "copy the file in" in str(error.value)
    assert SECRET not in "".join(traceback.format_exception(error.value))


def test_a_data_file_linked_out_of_data_root_is_refused(root: Path, outside: Path) -> None:
    (root / "env.csv").symlink_to(outside / "secret.csv")
    with pytest.raises(ValueError) as error:
        build_dataset("files", data_root=root, data_files="env.csv", columns={"features": ["b"], "label": "a"})
    refused(error, "env.csv")


def test_a_directory_linked_out_is_refused_for_the_files_under_it(root: Path, outside: Path) -> None:
    (root / "shared").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError) as error:
        build_dataset("files", data_root=root, data_files="shared/secret.jsonl", tokenizer="bytes",
                      columns={"text": "body"})
    refused(error, "shared/secret.jsonl")


def test_a_link_that_stays_inside_data_root_is_read(root: Path) -> None:
    name = write_text(root / "real", "jsonl", repeat=4)
    (root / "alias.jsonl").symlink_to(root / "real" / name)
    bundle = build_dataset("files", data_root=root, data_files="alias.jsonl", tokenizer="bytes",
                           columns={"text": "body"}, max_len=16)
    assert bundle.info.train_size and bundle.info.train_size > 0


def test_a_tokenizer_linked_out_is_refused(root: Path, tmp_path: Path) -> None:
    write_text(root, "jsonl", repeat=4)
    (root / "tok").symlink_to(train_tokenizer(tmp_path / "alice_tok"), target_is_directory=True)
    with pytest.raises(ValueError) as error:
        build_dataset("files", data_root=root, data_files="text.jsonl", tokenizer="tok", columns={"text": "body"})
    refused(error, "tok")


def test_a_csv_parse_error_does_not_quote_the_line(root: Path) -> None:
    """pyarrow's message is `Expected 2 columns, got 3: <the line>`: not passed on."""
    (root / "bad.csv").write_text(f"a,b\n1,2\n{SECRET},x,y\n")
    with pytest.raises(ValueError, match="could not be read as csv") as error:
        build_dataset("files", data_root=root, data_files="bad.csv", columns={"features": ["b"], "label": "a"})
    assert SECRET not in "".join(traceback.format_exception(error.value))


def test_an_image_class_folder_or_image_linked_out_is_refused(root: Path, tmp_path: Path) -> None:
    theirs = make_image_folder(tmp_path / "alice_images", per_class=2, size=8)
    make_image_folder(root, per_class=2, size=8)
    (root / "red" / "theirs.png").symlink_to(theirs / "red" / "0.png")
    with pytest.raises(ValueError) as error:
        build_dataset("imagefolder", data_root=root, image_size=8)
    refused(error, "red/theirs.png")
    (root / "red" / "theirs.png").unlink()
    (root / "train").mkdir()
    (root / "train" / "blue").symlink_to(theirs / "blue", target_is_directory=True)
    with pytest.raises(ValueError) as error:
        build_dataset("imagefolder", data_root=root, image_size=8)
    refused(error, "train/blue")


def test_an_image_path_in_a_column_is_opened_only_inside_data_root(root: Path, tmp_path: Path) -> None:
    theirs = make_image_folder(tmp_path / "alice_images", per_class=2, size=8)
    rows = [{"img": {"bytes": None, "path": str(theirs / "red" / f"{i % 2}.png")}, "y": i % 2} for i in range(6)]
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bundle = build_dataset("files", data_root=root, data_files="rows.jsonl", columns={"image": "img", "label": "y"},
                           image_size=8)
    with pytest.raises(ValueError) as error:
        bundle.train[0]
    refused(error, str(theirs / "red" / "0.png"))


def test_hf_disk_files_linked_out_or_named_out_are_refused(root: Path, tmp_path: Path) -> None:
    import datasets

    rows = [{"x": float(i), "y": i % 2} for i in range(8)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "alice_saved"))
    datasets.Dataset.from_list(rows).save_to_disk(str(root / "saved"))
    [arrow] = (root / "saved").glob("*.arrow")
    columns = {"features": ["x"], "label": "y"}
    # The state names a file of another directory: load_from_disk joins the name as it is.
    state = json.loads((root / "saved" / "state.json").read_text())
    state["_data_files"][0]["filename"] = f"../../alice_saved/{arrow.name}"
    (root / "saved" / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError) as error:
        build_dataset("hf_disk", data_root=root / "saved", columns=columns)
    refused(error, f"../../alice_saved/{arrow.name}")
    state["_data_files"][0]["filename"] = arrow.name
    (root / "saved" / "state.json").write_text(json.dumps(state))
    arrow.unlink()
    arrow.symlink_to(tmp_path / "alice_saved" / arrow.name)
    with pytest.raises(ValueError) as error:
        build_dataset("hf_disk", data_root=root / "saved", columns=columns)
    refused(error, arrow.name)


def test_torchvision_files_linked_out_are_refused(root: Path, outside: Path) -> None:
    """CIFAR-10's batches are unpickled: a link out would unpickle another owner's file."""
    (root / "cifar-10-batches-py").mkdir()
    (root / "cifar-10-batches-py" / "data_batch_1").symlink_to(outside / "secret.csv")
    with pytest.raises(ValueError) as error:
        build_dataset("cifar10", data_root=root)
    refused(error, "cifar-10-batches-py/data_batch_1")


def test_a_saved_hf_model_with_a_weights_file_linked_out_is_refused(root: Path, tmp_path: Path) -> None:
    tiny = {"n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 128}
    saved = build_model("hf:gpt2", "text", **tiny)
    saved.save_pretrained(tmp_path / "alice_model")  # type: ignore[operator]
    (root / "model").mkdir()
    for file in (tmp_path / "alice_model").iterdir():
        (root / "model" / file.name).symlink_to(file)
    with pytest.raises(ValueError) as error:
        build_model(f"hf:{root / 'model'}", "text")
    assert error.type is OutsideDataRoot and "leads outside data_root" in str(error.value)
