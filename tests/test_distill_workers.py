"""distill-data with several workers: identity from the environment or the recipe, round-robin shards, and a
merged result equal to one worker's, whatever the order the workers finish in. CPU, tiny target, seconds."""
import json
import threading

import pytest
from datasets import load_from_disk

import specdraft.distill.run as distill
from specdraft.distill.run import merge_only, run_distill
from specdraft.distill.workers import Worker, local_device_index, resolve_worker, worker_from_env, worker_shards
from specdraft import cli
from specdraft.config import DistillConfig
from specdraft.data.format import dataset_dir, read_counts, shards_dir
from specdraft.core.errors import SpecdraftError
from specdraft.recipes import load_recipe
from tests.test_distill import RECORDS

@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    from specdraft.testing.tiny import save_tiny_target

    return save_tiny_target(tmp_path_factory.mktemp("workers_target"))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """One prompt file for every test (rows name their source file): 9 conversations, one of them skipped."""
    records = RECORDS + [{"prompt": f"question number {i}"} for i in range(4)]
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def make_recipe(tmp_path, target_dir, prompts, overrides=()):
    path = tmp_path / "recipe.yaml"
    path.write_text(f"target: {{path: {target_dir}}}\nmethod: {{name: eagle3}}\n"
                    f"data: {{prompts: [{prompts}], max_length: 256}}\n"
                    f"distill: {{output_dir: {tmp_path / 'out'}, max_new_tokens: 6, batch_size: 2, shard_size: 1}}\n")
    return load_recipe(path, list(overrides))


def worker_recipe(tmp_path, target_dir, prompts, index, count):
    return make_recipe(tmp_path, target_dir, prompts, [f"distill.num_workers={count}", f"distill.worker_index={index}"])


@pytest.fixture(scope="module")
def single(tmp_path_factory, target_dir, prompts):
    """The reference: one worker over the whole prompt set -> (rows, counts, errors)."""
    tmp_path = tmp_path_factory.mktemp("single")
    counts = run_distill(make_recipe(tmp_path, target_dir, prompts), device="cpu")
    out = tmp_path / "out"
    return load_from_disk(str(dataset_dir(out))).to_list(), counts, (out / "errors.jsonl").read_text()


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 1)),
    ({"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_COUNT": "4"}, (2, 4)),
    ({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_COUNT": "5",
      "SLURM_ARRAY_TASK_STEP": "2"}, (4, 5)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8)),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}, (1, 2)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, (0, 1)),  # a batch script without srun is one process
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "batch"}, (0, 1)),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "3",
      "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0"}, (3, 6)),  # array task 1, srun task 1
])
def test_worker_from_environment(env, expected):
    worker = worker_from_env(env)
    assert (worker.index, worker.count) == expected


def test_recipe_keys_override_the_environment():
    env = {"RANK": "1", "WORLD_SIZE": "2"}
    assert resolve_worker(DistillConfig(num_workers=3, worker_index=2), env) == Worker(2, 3, "recipe")
    assert (resolve_worker(DistillConfig(num_workers=4), env).index, resolve_worker(DistillConfig(), env).count) \
        == (1, 2)
    with pytest.raises(SpecdraftError, match=r"worker index 5 is outside \[0, 2\).*distill.num_workers"):
        resolve_worker(DistillConfig(worker_index=5), env)
    with pytest.raises(SpecdraftError, match=r"distill.worker_index must be in \[0, 2\), got 2"):
        DistillConfig(num_workers=2, worker_index=2)
    assert local_device_index({"SLURM_LOCALID": "1"}) == 1 and local_device_index({"LOCAL_RANK": "0"}) == 0


@pytest.mark.parametrize("num_shards", [0, 1, 5, 17])
@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_round_robin_shards_partition(num_shards, count):
    owned = [worker_shards(num_shards, Worker(index, count, "recipe")) for index in range(count)]
    assert sorted(i for shards in owned for i in shards) == list(range(num_shards))


def test_three_workers_in_any_order_equal_one(tmp_path, target_dir, prompts, single, monkeypatch):
    rows, counts, errors = single
    recipes = {i: worker_recipe(tmp_path, target_dir, prompts, i, 3) for i in range(3)}
    out = tmp_path / "out"
    first = run_distill(recipes[2], device="cpu")
    assert first == {"worker": 2, "workers": 3, "shards_written": 3, "shards_missing": 6}
    assert sorted(p.name for p in shards_dir(out).iterdir()) == ["shard-00002", "shard-00005", "shard-00008"]
    assert run_distill(recipes[0], device="cpu")["shards_missing"] == 3 and not dataset_dir(out).exists()
    assert run_distill(recipes[1], device="cpu") == counts == read_counts(out)  # the last one merges
    merged = load_from_disk(str(dataset_dir(out))).to_list()
    assert merged == rows
    assert len({(row["source"], row["index"]) for row in merged}) == len(merged)
    assert (out / "errors.jsonl").read_text() == errors
    throughput = json.loads((out / "throughput.json").read_text())
    assert throughput["workers"] == 3 and [w["worker"] for w in throughput["per_worker"]] == [0, 1, 2]
    assert throughput["generated_tokens"] == sum(w["generated_tokens"] for w in throughput["per_worker"]) > 0
    merge_record, inode = (out / "merged.json").read_text(), dataset_dir(out).stat().st_ino
    monkeypatch.setattr(distill, "generate_answers", lambda *args: pytest.fail("nothing to generate"))
    assert run_distill(recipes[0], device="cpu") == counts  # a re-run finds its shards and the merge done
    assert (out / "merged.json").read_text() == merge_record and dataset_dir(out).stat().st_ino == inode


def test_resume_with_another_worker_count(tmp_path, target_dir, prompts, single, monkeypatch):
    rows, counts, _ = single
    half = worker_recipe(tmp_path, target_dir, prompts, 1, 2)
    assert run_distill(half, device="cpu")["shards_written"] == 4  # shards 1, 3, 5, 7
    generated = []
    original = distill.distill_shard
    monkeypatch.setattr(distill, "distill_shard",
                        lambda ctx, dialogs, index: generated.append(index) or original(ctx, dialogs, index))
    assert run_distill(make_recipe(tmp_path, target_dir, prompts), device="cpu") == counts
    assert generated == [0, 2, 4, 6, 8]
    assert load_from_disk(str(dataset_dir(tmp_path / "out"))).to_list() == rows


def test_merge_flag(tmp_path, target_dir, prompts, single, capsys):
    rows, counts, _ = single
    recipe = worker_recipe(tmp_path, target_dir, prompts, 0, 2)
    run_distill(recipe, device="cpu")
    with pytest.raises(SpecdraftError, match=r"4 of 9 shards are missing .*shard-00001, shard-00003"):
        merge_only(recipe)
    run_distill(worker_recipe(tmp_path, target_dir, prompts, 1, 2), device="cpu")
    (tmp_path / "out" / "merged.json").unlink()  # as if the last worker died before merging
    assert cli.main(["distill-data", str(tmp_path / "recipe.yaml"), "--merge"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == counts
    assert load_from_disk(str(dataset_dir(tmp_path / "out"))).to_list() == rows


def test_concurrent_workers(tmp_path, target_dir, prompts, single):
    rows, counts, _ = single
    results, failures = {}, []
    recipes = [worker_recipe(tmp_path, target_dir, prompts, index, 2) for index in range(2)]

    def work(index):
        try:
            results[index] = run_distill(recipes[index], device="cpu")
        except Exception as err:  # re-raised below in the test's thread
            failures.append(err)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert counts in results.values()
    assert load_from_disk(str(dataset_dir(tmp_path / "out"))).to_list() == rows
    assert not list((tmp_path / "out").glob(".tmp-*")) and not list(shards_dir(tmp_path / "out").glob(".tmp-*"))
