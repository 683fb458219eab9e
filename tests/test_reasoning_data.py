"""The user's own reasoning data: JSONL, JSON and parquet files in RLinf's and GSM8K's shapes load with the answers
the verifier compares (a string, a number, a list, '#### 72', '\\boxed{72}'); bad files are refused by the train
entry with exit 2 and one line naming the key, the file and the line, before any worker starts."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from rlinf_mini.config import load_config
from rlinf_mini.data.prompt_dataset import PromptDataset, reference_answer
from rlinf_mini.data.rows import read_rows
from rlinf_mini.models.tiny_lm import build_char_tokenizer, save_causal_lm, tiny_gpt2
from rlinf_mini.train import ReasoningRunPlan, main
from stages.reasoning_reward import math_reward

CONFIG = str(ROOT / "configs/math.yaml")
GSM8K_ROW = {"question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
             "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """An untrained tiny GPT-2 folder with the character tokenizer: the entry's checks need its tokenizer only."""
    path = tmp_path_factory.mktemp("lm") / "model"
    tok = build_char_tokenizer()
    save_causal_lm(tiny_gpt2(len(tok), 16, 1, n_positions=64, seed=0), tok, path)
    return path


def write_jsonl(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def cfg_for(train: str, val: str, model_dir, *extra: str):
    return load_config(argv_for(train, val, model_dir, *extra))


def argv_for(train: str, val: str, model_dir, *extra: str) -> list[str]:
    return ["--config", CONFIG, "--data.dataset-name", "", "--actor.model.model-path", str(model_dir),
            "--data.train-data-paths", train, "--data.val-data-paths", val, "--runner.logger.log-path",
            str(model_dir.parent / "results"), *extra]


def test_answers_as_string_number_list_gsm8k_and_boxed_become_the_final_answer(tmp_path, model_dir):
    rows = [{"prompt": "1+1=", "solutions": "2"}, {"prompt": "2+2=", "solutions": 4},
            {"prompt": "1/2=", "solutions": [0.5, "\\frac{1}{2}"]}, {"prompt": "3+3=", "solutions": "... #### 6"},
            {"prompt": "4+4=", "solutions": "so it is \\boxed{8}."}, {"prompt": "5+5=", "solutions": "#### 1,000"}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    data = PromptDataset.from_files([path], cfg_for(path, path, model_dir).data, build_char_tokenizer())
    assert data.answers == [["2"], ["4"], ["0.5", "\\frac{1}{2}"], ["6"], ["8"], ["1,000"]]
    assert data.prompts[1] == "2+2=" and len(data.prompt_ids[1]) == 4
    assert math_reward("\\boxed{4}", data.answers[1]) == 1.0
    assert math_reward("1/2", data.answers[2]) == 1.0
    assert math_reward("reasoning ... #### 1000", data.answers[5]) == 1.0


def test_the_verifier_reads_gsm8k_answers_in_references_and_responses():
    ref = reference_answer(GSM8K_ROW["answer"])
    assert ref == "72"
    # the '####' line wins over a later number; without '####' the last number counts (as before)
    assert math_reward("48/2 = 24, 48+24 = 72\n#### 72\nCheck: 7 apples", [ref]) == 1.0
    assert math_reward("48/2 = 24\n#### 24\n", [ref]) == -1.0
    assert math_reward("so 72 clips", [ref]) == 1.0
    assert reference_answer("\\boxed{\\frac{1}{2}} and more") == "\\frac{1}{2}"
    assert reference_answer("12") == "12"


def test_gsm8k_shaped_parquet_json_and_jsonl_load_the_same(tmp_path, model_dir):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [GSM8K_ROW, {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gsm8k.parquet")
    (tmp_path / "gsm8k.json").write_text(json.dumps(rows))
    jsonl = write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    data = cfg_for(jsonl, jsonl, model_dir, "--data.prompt-key", "question", "--data.answer-key", "answer",
                   "--data.max-prompt-length", "100", "--runner.seq-length", "120").data
    loaded = [PromptDataset.from_files([str(tmp_path / f"gsm8k.{ext}")], data, build_char_tokenizer())
              for ext in ("parquet", "json", "jsonl")]
    for d in loaded:
        assert d.prompts == [r["question"] for r in rows] and d.answers == [["72"], ["5"]]
        assert d.prompt_ids == loaded[0].prompt_ids


def test_the_entrys_plan_reads_parquet_and_notes_the_prompts_it_drops(tmp_path, model_dir, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = [{"q": f"{a}+{b}=", "a": a + b} for a in range(10) for b in range(10)] + [{"q": "123456789+1=", "a": 0}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    val = write_jsonl(tmp_path / "val.jsonl", [{"q": "1+1=", "a": "2"}])
    argv = argv_for(str(tmp_path / "train.parquet"), val, model_dir, "--data.prompt-key", "q",
                    "--data.answer-key", "a")
    plan = ReasoningRunPlan(load_config(argv), "test")
    plan.prepare()  # reads the datasets
    assert len(plan.train_set) == 100 and plan.train_set.answers[37] == ["10"]  # 3+7=
    assert plan.train_set.dropped == [f"{tmp_path / 'train.parquet'} row 101"]
    note = capsys.readouterr().err.strip()
    assert note.startswith("note: data.train_data_paths: 1 of 101 prompts") and "row 101" in note


def test_parquet_without_pyarrow_names_the_file_and_the_extra(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)  # import now raises ImportError
    with pytest.raises(ValueError, match=r"t\.parquet is parquet, which needs pyarrow: pip install 'rlinf_mini\["):
        list(read_rows(tmp_path / "t.parquet", "data.train_data_paths"))


GOOD = {"prompt": "1+2=", "solutions": ["3"]}


@pytest.mark.parametrize("name,content,must_name", [
    ("malformed line", [GOOD, '{"prompt": "1+1=", "solutions": ["2"]'], "train.jsonl line 2: not valid JSON"),
    ("not an object", [GOOD, "[1, 2]"], "train.jsonl line 2: needs a JSON object"),
    ("missing prompt key", [GOOD, {"question": "2+2=", "solutions": ["4"]}], "train.jsonl line 2: no key 'prompt'"),
    ("missing answer key", [GOOD, {"prompt": "2+2="}], "train.jsonl line 2: no key 'solutions'"),
    ("empty file", [], "train.jsonl is empty"),
    ("blank lines only", ["", "  "], "train.jsonl is empty"),
    ("answer null", [{"prompt": "2+2=", "solutions": None}], "train.jsonl line 1: 'solutions' must be"),
    ("answer empty list", [{"prompt": "2+2=", "solutions": []}], "train.jsonl line 1: 'solutions' must be"),
    ("chat-message prompt", [{"prompt": [{"role": "user", "content": "2+2="}], "solutions": "4"}],
     "train.jsonl line 1: 'prompt' must be a non-empty string"),
    ("prompt too long, filter off", [GOOD, {"prompt": "1234567+1=", "solutions": "1234568"}],
     "train.jsonl line 2: the prompt has 10 tokens, more than data.max_prompt_length=8"),
    ("every prompt too long", [{"prompt": "1234567+1=", "solutions": "1234568"}],
     "no prompt of at most data.max_prompt_length=8 tokens"),
])
def test_bad_data_is_one_line_naming_file_and_line_before_any_worker(tmp_path, model_dir, capsys, monkeypatch, name,
                                                                     content, must_name):
    from rlinf_mini.scheduler import cluster as cluster_module

    def no_cluster(*args, **kwargs):
        raise AssertionError("a Cluster was started for bad data")

    monkeypatch.setattr(cluster_module.Cluster, "__init__", no_cluster)
    train = write_jsonl(tmp_path / "train.jsonl", content) if content else str(tmp_path / "train.jsonl")
    if not content:
        (tmp_path / "train.jsonl").write_text("")
    val = write_jsonl(tmp_path / "val.jsonl", [GOOD])
    extra = ["--data.no-filter-prompt-by-length"] if "filter off" in name else []
    assert main(argv_for(train, val, model_dir, *extra)) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and must_name in lines[0] and "data.train_data_paths" in lines[0], out.err
    assert out.out == ""
    assert not (model_dir.parent / "results").exists()  # no run folder: nothing started


def test_an_unknown_file_format_is_named(tmp_path, model_dir):
    (tmp_path / "train.csv").write_text("prompt,solutions\n1+1=,2\n")
    with pytest.raises(ValueError, match=r"data.train_data_paths: .*train\.csv: unknown format '\.csv'"):
        list(read_rows(tmp_path / "train.csv", "data.train_data_paths"))


def test_val_file_errors_name_the_val_key(tmp_path, model_dir, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [GOOD] * 16)
    val = write_jsonl(tmp_path / "val.jsonl", [{"prompt": "1+1="}])
    assert main(argv_for(train, val, model_dir)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.val_data_paths" in err and "val.jsonl line 1: no key 'solutions'" in err
