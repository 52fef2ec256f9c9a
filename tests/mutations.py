"""The proof of the proofs: each lesson's realistic bugs, applied one at a time to a copy of the project, and the test
that should catch each one, run against that copy. A test catches its bug when it passes on the copy without the bug
(the control) and fails with it.

    python tests/mutations.py                                  # every bug: about 25 minutes on 2 cores
    python tests/mutations.py --only accum --only DDP          # the bugs whose lesson or name contains a word
    python tests/mutations.py --out results/mutations/DATE     # table.md, log.txt and env.json there
    python tests/mutations.py --list                           # the bugs and their tests, nothing run

Each bug is an exact text replacement in one script (its `old` text must occur exactly once:
tests/test_mutations.py checks that on every test run, so the list follows the scripts). The copy holds src/,
tests/ and bench/ with data/ linked in; the test runs there under pytest, as the test command runs it. Outputs are
written atomically; Ctrl-C or SIGTERM stops the run (the copy is removed) and keeps no partial table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

import common  # noqa: E402

EQ = "tests/test_equivalence.py::"
GPT = "tests/test_gpt.py::"
MUON = "tests/test_muon.py::test_muon_takes_the_block_matrices_and_three_steps_match_muon_written_out"
MUON_FAST = "tests/test_muon.py::test_train_fast_s_gpt_takes_train_muon_s_optimizers_and_steps"
NATIVE = "tests/test_muon.py::test_a_cpu_without_native_bfloat16_gets_float32_newton_schulz_and_train_fast_leaves_autocast_off"
CKDIR = "tests/test_checkpoint_dir.py::"
NS = "tests/test_muon.py::test_common_muon_in_bfloat16_is_torch_s_bit_for_bit_and_in_float32_is_newton_schulz_written_out"
CE = "tests/test_chunked_ce.py::"
FLEX = "tests/test_flex_attention.py::test_each_packed_speech_s_logits_are_those_of_the_speech_alone"
VARLEN = "test_varlen_pads_right_so_each_real_token_s_loss_is_its_unpadded_one_and_buckets_hold_every_speech"
# (lesson, bug, file, old text, new text, test): the realistic bugs, at least one per lesson
MUTATIONS = [
    ("train_DDP.py", "set_epoch removed: every epoch repeats the first one's order", "src/train_DDP.py",
     "        sampler.set_epoch(epoch)  # new #\n", "        pass\n",
     EQ + "test_ddp_matches_train"),
    ("train_DDP.py", "every rank's sampler given rank 0's shard", "src/train_DDP.py",
     "num_replicas=world_size, rank=rank, shuffle=True", "num_replicas=world_size, rank=0, shuffle=True",
     EQ + "test_ddp_matches_train"),
    ("train_DDP.py", "the epoch's train loss is rank 0's shard only (not all-reduced)", "src/train_DDP.py",
     "    dist.all_reduce(loss_sum)  # the epoch's", "    loss_sum *= world_size  # the epoch's",
     EQ + "test_ddp_matches_train"),
    ("train_accum.py", "the micro-batch loss not divided by K", "src/train_accum.py",
     "            (loss / args.accum_steps).backward()", "            loss.backward()",
     EQ + "test_accum_matches_ddp"),
    ("train_accum.py", "no_sync around the wrong micro-batch: the all-reduce after the first of K", "src/train_accum.py",
     "sync = micro % args.accum_steps == 0 or", "sync = micro % args.accum_steps == 1 or",
     EQ + "test_accum_matches_ddp"),
    ("train_DDP_elastic.py", "a resume that skips one batch too many", "src/train_DDP_elastic.py",
     "sampler.start = done * args.batch_size", "sampler.start = (done + 1) * args.batch_size",
     EQ + "test_elastic_restarts_match_uninterrupted"),
    ("train_FSDP.py", "every rank trains on rank 0's batch (the same data everywhere)", "src/train_FSDP.py",
     "common.synthetic_data(args, device, seed=rank)", "common.synthetic_data(args, device, seed=0)",
     EQ + "test_fsdp_matches_ddp_and_resumes"),
    ("train_FSDP.py", "the loss scaled by the world size: gradients summed over the ranks, not averaged",
     "src/train_FSDP.py",
     "        loss = criterion(logits, labels)\n", "        loss = criterion(logits, labels) * world_size\n",
     EQ + "test_fsdp_matches_ddp_and_resumes"),
    ("train_FSDP.py", "a mid-epoch resume that skips one batch too many", "src/train_FSDP.py",
     "    done = max(0, step - epoch * len(train_loader))", "    done = max(0, step - epoch * len(train_loader)) + 1",
     EQ + "test_fsdp_matches_ddp_and_resumes"),
    ("train_FSDP.py", "every rank's sampler given rank 0's shard of Fashion-MNIST", "src/train_FSDP.py",
     "num_replicas=world_size, rank=rank, shuffle=True", "num_replicas=world_size, rank=0, shuffle=True",
     EQ + "test_fsdp_matches_train"),
    ("train_FSDP.py", "set_epoch removed: every epoch repeats the first one's order of Fashion-MNIST",
     "src/train_FSDP.py", "        sampler.set_epoch(epoch)  # new #\n", "        pass\n",
     EQ + "test_fsdp_matches_train"),
    ("train_amp.py", "unscale_ removed before clipping: the scaled gradients are clipped", "src/train_amp.py",
     "            scaler.unscale_(optimizer)  # new #", "            pass  # new #",
     EQ + "test_amp_float16_scaler_clips_true_grads"),
    ("train_amp.py", "autocast that wraps nothing (forward and loss dedented out of it): float32", "src/train_amp.py",
     "            logits = model(images)\n            loss = criterion(logits, labels)\n",
     "            pass\n        logits = model(images)\n        loss = criterion(logits, labels)\n",
     EQ + "test_amp_bfloat16_loss_follows_train"),
    ("train_channels_last.py", "the model left in NCHW (its memory_format dropped)", "src/train_channels_last.py",
     ".to(device, memory_format=torch.channels_last)  # new #", ".to(device)  # new #",
     EQ + "test_channels_last_matches_amp"),
    ("train_compile.py", "compile bypassed: the loop calls the eager model", "src/train_compile.py",
     "            logits = compiled(images)  # new #", "            logits = model(images)  # new #",
     EQ + "test_compile_matches_eager"),
    ("train_compile.py", "regional compile: torch.compile's returned block dropped (it does not compile in place)",
     "src/train_compile.py",
     "    regions = [torch.compile(m, mode=args.compile_mode, dynamic=False) if m in model.blocks else m for m in model]\n",
     "    for block in model.blocks:\n        torch.compile(block, mode=args.compile_mode, dynamic=False)\n"
     "    regions = list(model)\n",
     GPT + "test_regional_compile_one_graph_serves_every_block"),
    ("train_fast.py", "the device loader shuffles on its own instead of with the base's sampler", "src/train_fast.py",
     "batch_sampler=loader.batch_sampler,", "batch_size=loader.batch_size, shuffle=True, drop_last=loader.drop_last,",
     EQ + "test_fast_matches_compile"),
    ("train_tf32.py", "the older global setting, set_float32_matmul_precision('high'): the CPU's oneDNN matmuls too",
     "src/train_tf32.py",
     'torch.backends.cuda.matmul.fp32_precision = "tf32"', 'torch.set_float32_matmul_precision("high")',
     EQ + "test_tf32_is_train_bit_for_bit_on_a_cpu_and_sets_tf32"),
    ("train_tf32.py", "the matmuls' setting left out: only cuDNN's convolutions in TF32 (train.py's default)",
     "src/train_tf32.py",
     'torch.backends.cuda.matmul.fp32_precision = "tf32"  #', 'pass  #',
     EQ + "test_tf32_is_train_bit_for_bit_on_a_cpu_and_sets_tf32"),
    ("train_compiled_optimizer.py", "the schedule's beta1 left a Python float: the step recompiles at every step",
     "src/train_compiled_optimizer.py",
     "        tensors_back()  # new # the new beta1, into its tensor\n", "",
     EQ + "test_compiled_optimizer_matches_train_and_compiles_once"),
    ("train_compiled_optimizer.py", "the step called eagerly: optimizer.step() in the loop, nothing compiled",
     "src/train_compiled_optimizer.py",
     "        optimizer_step()  # new #", "        optimizer.step()  # new #",
     EQ + "test_compiled_optimizer_matches_train_and_compiles_once"),
    ("train_compiled_optimizer.py", "a resume's loaded tensors left out: the first resumed step takes the peak rate",
     "src/train_compiled_optimizer.py",
     "                mine.copy_(value)  # the same tensor", "                pass  # the same tensor",
     EQ + "test_compiled_optimizer_resumes_where_it_stopped"),
    ("train_compiled_optimizer.py", "beta1's tensor never refilled: the schedule's beta1 never reaches the step (0.9 throughout)",
     "src/train_compiled_optimizer.py",
     "                mine.fill_(value)  # the schedule's float beta1", "                pass  #",
     EQ + "test_compiled_optimizer_matches_train_and_compiles_once"),
    ("train_flex_attention.py", "the plain causal mask: a speech attends to the speeches before it in its block",
     "src/train_flex_attention.py", "return (k <= q) & (speech[b, q] == speech[b, k])", "return k <= q", FLEX),
    ("train_flex_attention.py", "a speech starts one character late: its first character attends to the one before",
     "src/train_flex_attention.py", "starts = before & newline & ~after",
     "starts = torch.cat([none, (before & newline & ~after)[:, :-1]], 1)", FLEX),
    ("train_flex_attention.py", "positions count from the block's start, not the speech's",
     "src/train_flex_attention.py", "return self.token(tokens) + self.position(offset)",
     "return self.token(tokens) + self.position(torch.arange(tokens.size(1), device=tokens.device))", FLEX),
    ("train_chunked_ce.py", "each chunk's mean times its size: its sum without ignored targets, not with them",
     "src/train_chunked_ce.py",
     'cross_entropy(fc(h), y, reduction="sum")', 'cross_entropy(fc(h), y) * y.numel()',
     CE + "test_the_chunked_loss_and_its_gradients_are_the_whole_logits_ones_ignored_targets_included"),
    ("train_chunked_ce.py", "the ignored targets counted in the mean's divisor", "src/train_chunked_ce.py",
     "    return total / (targets != -100).sum()", "    return total / targets.numel()",
     CE + "test_the_chunked_loss_and_its_gradients_are_the_whole_logits_ones_ignored_targets_included"),
    ("train_chunked_ce.py", "no checkpoint: every chunk's logits kept for backward, as many as the whole",
     "src/train_chunked_ce.py",
     "torch.utils.checkpoint.checkpoint(\n            summed_loss, h, y, use_reentrant=False, preserve_rng_state=False\n        )",
     "summed_loss(h, y)",
     CE + "test_the_chunked_loss_and_its_gradients_are_the_whole_logits_ones_ignored_targets_included"),
    ("train_chunked_ce.py", "the head's final LayerNorm left out of the hidden states", "src/train_chunked_ce.py",
     "hidden = model.head.norm(body(images))", "hidden = body(images)",
     CE + "test_the_rung_trains_train_py_s_gpt_and_keeps_no_logits_for_backward"),
    ("train_compile_cache.py", "the file never loaded: every start compiles cold", "src/train_compile_cache.py",
     "    loaded = torch.compiler.load_cache_artifacts(cache_file.read_bytes())", "    loaded = None  #",
     EQ + "test_compile_cache_starts_warm_from_its_file_alone_and_trains_as_train_compile"),
    ("train_compile_cache.py", "the instruction set left out of the file's name: an AVX2 run loads AVX512 kernels",
     "src/train_compile_cache.py",
     'else str(pick_vec_isa())', 'else "cpu"',
     EQ + "test_compile_cache_starts_warm_from_its_file_alone_and_trains_as_train_compile"),
    ("train_compile_cache.py", "the batch size left out of the file's name: two shapes overwrite each other's file",
     "src/train_compile_cache.py", '-b{args.batch_size}-{args.compile_mode}', '-{args.compile_mode}',
     EQ + "test_compile_cache_starts_warm_from_its_file_alone_and_trains_as_train_compile"),
    ("train_compile_cache.py", "a file that is not torch's: its traceback on stderr, not one line",
     "src/train_compile_cache.py",
     'logging.getLogger("torch.compiler._cache").setLevel(logging.CRITICAL)', 'pass',
     EQ + "test_compile_cache_starts_warm_from_its_file_alone_and_trains_as_train_compile"),
    ("train_float8.py", "no filter: torchao converts every Linear, the head and its 84 outputs too", "src/train_float8.py",
     "convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name not in kept)",
     "convert_to_float8_training(model, config=config)",
     EQ + "test_float8_converts_what_torchao_s_filter_says_keeps_the_head_and_refuses_a_cpu[gpt2-tensorwise-all]"),
    ("train_float8.py", "torchao's size filter left out: every layer converted at GPT-2's width, small ones too",
     "src/train_float8.py", "if not args.float8_all_layers and not pays(module, name):", "if False:",
     EQ + "test_float8_converts_what_torchao_s_filter_says_keeps_the_head_and_refuses_a_cpu[gpt2-tensorwise]"),
    ("train_float8.py", "the filter of the default recipe whatever --float8-recipe says", "src/train_float8.py",
     "pays = _auto_filter_for_recipe(args.float8_recipe, filter_fqns=[])",
     "pays = _auto_filter_for_recipe(\"tensorwise\", filter_fqns=[])",
     EQ + "test_float8_converts_what_torchao_s_filter_says_keeps_the_head_and_refuses_a_cpu[gpt-wide-rowwise]"),
    ("train_float8.py", "pad_inner_dim lost: a ViT's 197 tokens a sample fail torch._scaled_mm in backward on a GPU",
     "src/train_float8.py", "config = dataclasses.replace(config, pad_inner_dim=True, emulate=args.float8_emulate)",
     "config = dataclasses.replace(config, emulate=args.float8_emulate)",
     EQ + "test_float8_emulated_compiles_into_train_compile_s_graphs_with_no_break_in_both_recipes"),
    ("train_float8.py", "--float8-recipe rowwise runs torchao's default config (tensorwise scales)", "src/train_float8.py",
     "config = Float8LinearConfig.from_recipe_name(args.float8_recipe)", "config = Float8LinearConfig()",
     EQ + "test_float8_emulated_compiles_into_train_compile_s_graphs_with_no_break_in_both_recipes"),
    ("train_cuda_graphs.py", "no refusal on a CPU: the script goes on to torch.cuda.Stream()", "src/train_cuda_graphs.py",
     'if device.type != "cuda":\n    common.die(', 'if False:\n    common.die(',
     EQ + "test_cuda_graphs_refuse_a_cpu_and_the_compile_modes_that_capture_graphs_in_one_line"),
    ("train_async_checkpoint.py", "async save: last.pt names the shards as their write starts, not once on disk",
     "src/train_async_checkpoint.py",
     "    pending = (writing, full, epochs_done, step, list(epochs))  # new # last.pt's, once the shards are on disk\n",
     "    write_last(full, epochs_done, step, epochs)\n",
     EQ + "test_async_checkpoint_matches_fsdp"),
    ("train_async_checkpoint.py", "the loop waits for the write it just started: a synchronous save",
     "src/train_async_checkpoint.py",
     "process_group=checkpoint_group)  # new #\n",
     "process_group=checkpoint_group)  # new #\n    writing.result()\n",
     EQ + "test_async_checkpoint_matches_fsdp"),
    ("train_DP.py", "the checkpoint saved from the wrapper: module. prefix", "src/train_DP.py",
     "common.save_checkpoint(checkpoint, args, model.module, optimizer, epoch + 1, step, epochs)",
     "common.save_checkpoint(checkpoint, args, model, optimizer, epoch + 1, step, epochs)",
     EQ + "test_dp_matches_train"),
    ("train_profile.py", "profiler.step() left out: the schedule never reaches its active steps", "src/train_profile.py",
     "        profiler.step()  # new #", "        pass  # new #",
     EQ + "test_profile_matches_train_and_writes_trace"),
    ("train_activation_checkpointing.py", "the checkpoint wrapper dropped: no block recomputed",
     "src/train_activation_checkpointing.py",
     "checkpointed = blocks[:-1][:: args.recompute_every]", "checkpointed = []",
     EQ + "test_checkpointing_matches_train[gpt]"),
    ("train_selective_AC.py", "selective AC keeps no nn.Linear: its op named without the overload (.default)",
     "src/train_selective_AC.py",
     "    torch.ops.aten.addmm.default,  #", "    torch.ops.aten.addmm,  #",
     EQ + "test_checkpointing_matches_train[gpt]"),
    ("train_selective_AC.py", "selective AC also keeps GELU's output: little memory saved, the lesson's trade lost",
     "src/train_selective_AC.py",
     "    torch.ops.aten.bmm.default,", "    torch.ops.aten.bmm.default,\n    torch.ops.aten.gelu.default,",
     EQ + "test_checkpointing_matches_train[gpt]"),
    ("train_activation_checkpointing.py", "--recompute-every applied after dropping the last block's turn: one block fewer",
     "src/train_activation_checkpointing.py",
     "checkpointed = blocks[:-1][:: args.recompute_every]", "checkpointed = blocks[:: args.recompute_every][:-1]",
     EQ + "test_checkpointing_matches_train[resnet18]"),
    ("train_selective_AC.py", "selective AC's kept outputs bypass the saved-tensor hooks: memory under-counted",
     "src/train_selective_AC.py",
     'respect_saved_tensors_hooks=True,', 'respect_saved_tensors_hooks=False,',
     EQ + "test_checkpointing_matches_train[gpt]"),
    ("train_selective_AC.py", "selective AC keeps no convolution: conv2d named, which never reaches the dispatcher",
     "src/train_selective_AC.py",
     "    torch.ops.aten.convolution.default,", "    torch.ops.aten.conv2d.default,",
     EQ + "test_checkpointing_matches_train[resnet18]"),
    ("train_selective_AC.py", "selective AC's recompute without the buffers put back: BatchNorm updates twice",
     "src/train_selective_AC.py",
     "    return forward, recomputing(block, replay)  # new #", "    return forward, replay  # new #",
     EQ + "test_checkpointing_matches_train[resnet18]"),
    ("train_activation_checkpointing.py", "BatchNorm's running statistics not put back after a recompute",
     "src/train_activation_checkpointing.py",
     "            buffer.copy_(value)", "            pass",
     EQ + "test_checkpointing_matches_train[resnet18]"),
    ("train_varlen.py", "padding on the left: a real token's position (and what it attends to) moves with the batch",
     "src/train_varlen.py",
     "padding_value=0)\n    targets = nn.utils.rnn.pad_sequence([s[1:] for s in samples], batch_first=True, padding_value=PAD)",
     "padding_value=0, padding_side=\"left\")\n    targets = nn.utils.rnn.pad_sequence([s[1:] for s in samples], "
     "batch_first=True, padding_value=PAD, padding_side=\"left\")",
     GPT + VARLEN),
    ("train_varlen.py", "padded targets are token 0, not PAD: the loss learns to predict padding", "src/train_varlen.py",
     "batch_first=True, padding_value=PAD)", "batch_first=True, padding_value=0)", GPT + VARLEN),
    ("train_varlen.py", "the buckets' batches in sorted order, never shuffled: every epoch the same batches, short first",
     "src/train_varlen.py",
     "for i in torch.randperm(len(batches), generator=self.generator).tolist():", "for i in range(len(batches)):",
     GPT + VARLEN),
    ("train_varlen.py", "each pool's last full batch cut off (an off-by-one in the bucket sampler)", "src/train_varlen.py",
     "range(0, len(pool) - self.batch_size + 1, self.batch_size)", "range(0, len(pool) - self.batch_size, self.batch_size)",
     GPT + VARLEN),
    ("train_varlen.py", "speeches cut without the shared token: each speech's first character never a target",
     "src/train_varlen.py", "[0, *(cut - 1 for cut in cuts)]", "[0, *cuts]", GPT + VARLEN),
    ("train_varlen.py", "the bucket sampler shuffles with the global RNG: a resume skips other batches than it trained",
     "src/train_varlen.py", "order = torch.randperm(len(self.lengths), generator=self.generator).tolist()",
     "order = torch.randperm(len(self.lengths)).tolist()", GPT + VARLEN),
    ("train_varlen.py", "tokens/s from the padded batch shape (pads counted as tokens)", "src/train_varlen.py",
     "meter.step(images.size(0), tokens=real)", "meter.step(images.size(0))", GPT + VARLEN),
    ("train_model_parallel.py", "the cut off by one block: the second stage starts one block after it (a block skipped)",
     "src/train_model_parallel.py",
     "    return list(zip((0, *cuts), (*cuts, len(blocks))))", "    return list(zip((0, *(c + 1 for c in cuts)), (*cuts, len(blocks))))",
     EQ + "test_model_parallel_matches_train"),
    ("train_TP.py", "a missing all-reduce in the row-wise layers: each rank keeps its partial sum", "src/train_TP.py",
     "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # new #\n",
     "from torch.distributed.tensor import Partial\nfrom torch.distributed.tensor.parallel import ColwiseParallel, "
     "parallelize_module\nfrom torch.distributed.tensor.parallel import RowwiseParallel as Rowwise\n\n\n"
     "def RowwiseParallel():  # the output left as partial sums: no all-reduce\n"
     "    return Rowwise(output_layouts=Partial())\n",
     EQ + "test_tp_matches_train"),
    ("train_TP.py", "the heads read as all 4 on each rank's half of q, k, v (view(n, t, heads, -1)): 4 heads of 16",
     "src/common/vit.py",
     "proj(x).view(n, t, -1, self.head_dim)", "proj(x).view(n, t, 4, -1)",
     EQ + "test_tp_matches_train"),
    ("train_pipeline.py", "the micro-batch losses not scaled: gradients summed over the 4 micro-batches",
     "src/train_pipeline.py",
     "loss_fn=criterion, scale_grads=True)", "loss_fn=criterion, scale_grads=False)",
     EQ + "test_pipeline_schedule[gpipe]"),
    ("train_pipeline.py", "gradients clipped by each stage's own norm (no all-reduce of the squares)",
     "src/train_pipeline.py",
     "            dist.all_reduce(square)  # new #", "            pass  # new #",
     EQ + "test_pipeline_schedule[1f1b]"),
    ("train_pipeline.py", "with 2 stages per rank, the optimizer built over the rank's first stage: the other never steps",
     "src/train_pipeline.py", "torch.optim.AdamW(stage_module.parameters()", "torch.optim.AdamW(stage_module[0].parameters()",
     EQ + "test_pipeline_schedule[interleaved1f1b]"),
    ("train_pipeline.py", "only the first p stages gathered (the one-stage-per-rank form): with 2 stages per rank "
     "the last stage's rank never receives the other rank's second stage, last.pt holds it untrained",
     "src/common/distributed.py",
     "    for blocks, rank in zip(stage_blocks, owner):\n",
     "    for blocks, rank in zip(stage_blocks, owner[: dist.get_world_size()]):\n",
     EQ + "test_pipeline_schedule[interleavedzerobubble]"),
    ("train_pipeline.py", "stages sent to the last rank from rank 0 only (a sync written for 2 ranks): with 4 ranks the "
     "middle stages never reach it",
     "src/common/distributed.py",
     "        if rank != to and me in (rank, to):\n",
     "        if rank == 0 and me in (rank, to):\n",
     EQ + "test_pipeline_on_four_ranks"),
    ("train_pipeline.py", "the zero-bubble schedules' theory taken as interleaved 1F1B's (p - 1) / (v m + p - 1): the "
     "weight gradients that fill the bubble not counted",
     "src/train_pipeline.py", 'units = 3 if "zerobubble" in args.schedule else 1', "units = 1",
     EQ + "test_pipeline_schedule[zbvzerobubble]"),
    ("train_TP.py", "a resume that restores the model but not the AdamW state (its moments start again at 0)",
     "src/common/distributed.py", 'model, optimizer, model_state_dict=state["model"], '
     'optim_state_dict=state["full_optimizer"],', 'model, [], model_state_dict=state["model"], optim_state_dict={},',
     EQ + "test_resume_after_sigterm[TP]"),
    ("train_pipeline.py", "last.pt written without the first stage's current weights (no sync before the save): a "
     "resume from a SIGTERM mid-epoch restarts stage 0 from stale weights",
     "src/common/distributed.py", "    sync_stages(stage_blocks, owner)\n    stage_optimizers", "    stage_optimizers",
     EQ + "test_resume_after_sigterm[pipeline]"),
    ("train_FSDP_TP.py", "the sampler split over every process (train_DDP.py's, world size and rank): the two tp ranks "
     "of a group get different images", "src/train_FSDP_TP.py",
     "DistributedSampler(train_set, num_replicas=dp, rank=dp_rank,",
     "DistributedSampler(train_set, num_replicas=world_size, rank=rank,",
     EQ + "test_fsdp_tp_matches_train"),
    ("train_FSDP_TP.py", "the data-parallel group read from the wrong mesh dimension (the tp rank): the tp pair is fed "
     "two batches, the two groups the same ones", "src/train_FSDP_TP.py",
     'dp_rank = mesh.get_local_rank("dp")', 'dp_rank = mesh.get_local_rank("tp")',
     EQ + "test_fsdp_tp_matches_train"),
    ("train_FSDP_TP.py", "the epoch's train loss not averaged over the groups: rank 0 reports its group's half",
     "src/train_FSDP_TP.py", '    dist.all_reduce(loss_sum, group=mesh["dp"].get_group())  # new #', "    pass  # new #",
     EQ + "test_fsdp_tp_matches_train"),
    ("train_FSDP_TP.py", "the mesh's shape swapped: (tp, dp) under the names (dp, tp)", "src/train_FSDP_TP.py",
     'init_device_mesh(device.type, (dp, args.tp), mesh_dim_names=("dp", "tp"))',
     'init_device_mesh(device.type, (args.tp, dp), mesh_dim_names=("dp", "tp"))',
     EQ + "test_fsdp_tp_matches_train"),
    ("train_FSDP_TP.py", "the epoch's train loss averaged over the tp size, not the data-parallel groups",
     "src/train_FSDP_TP.py", "    loss_sum /= dp  # new #", "    loss_sum /= args.tp  # new #",
     EQ + "test_fsdp_tp_matches_train"),
    ("train_FSDP_TP.py", "images/s times the tp size: every rank counted as if it trained images of its own",
     "src/train_FSDP_TP.py", '    summary["images_per_s"] *= dp  # new #', '    summary["images_per_s"] *= args.tp  # new #',
     EQ + "test_fsdp_tp_matches_train"),
    ("train_DDP_comm_hooks.py", "a hand-written bfloat16 hook that sums the buckets without dividing by the world size",
     "src/train_DDP_comm_hooks.py",
     '    model.register_comm_hook(None, getattr(default_hooks, f"{args.comm_hook}_compress_hook"))\n',
     "    def summed(_, bucket):\n"
     "        half = bucket.buffer().to(torch.bfloat16)\n"
     "        done = dist.all_reduce(half, async_op=True).get_future()\n"
     "        return done.then(lambda f: bucket.buffer().copy_(f.value()[0]))\n\n"
     "    model.register_comm_hook(None, summed)\n",
     EQ + "test_comm_hooks_change_only_the_wire"),
    ("train_DDP_comm_hooks.py", "PowerSGD's warm-up flag ignored: compression from the second step",
     "src/train_DDP_comm_hooks.py", "start_powerSGD_iter=args.powersgd_start_iter", "start_powerSGD_iter=2",
     EQ + "test_comm_hooks_change_only_the_wire"),
    ("train_DDP_comm_hooks.py", "PowerSGD's error feedback off: what compression drops is lost",
     "src/train_DDP_comm_hooks.py",
     "None, matrix_approximation_rank=args.powersgd_rank, start_powerSGD_iter=args.powersgd_start_iter",
     "None, matrix_approximation_rank=args.powersgd_rank, start_powerSGD_iter=args.powersgd_start_iter,"
     " use_error_feedback=False",
     EQ + "test_comm_hooks_change_only_the_wire"),
    ("loader_DALI.py", "DALI's per-epoch shuffle off: every epoch the first one's order", "src/common/dali.py",
     "            shuffle_after_epoch=training,", "            shuffle_after_epoch=False,",
     EQ + "test_loader_epochs_are_fresh_permutations[src/loader_DALI.py]"),
    # The GPT (tests/test_gpt.py): the attention lesson, the text's targets, and FSDP's sampler on real data
    ("train_sdpa.py", "the causal mask one place off: each position also sees the next character, its answer",
     "src/train_sdpa.py", "triu(diagonal=1)", "triu(diagonal=2)",
     GPT + "test_written_out_attention_trains_what_sdpa_trains"),
    ("train_sdpa.py", "the scores not scaled by 1 / sqrt(head_dim)", "src/train_sdpa.py",
     "scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))", "scores = q @ k.transpose(-2, -1)",
     GPT + "test_written_out_attention_trains_what_sdpa_trains"),
    ("train.py", "a resume that does not restore the epoch records: the metrics lose the epochs before the stop",
     "src/train.py", 'start_epoch, step, epochs = state["epoch"], state["step"], state["epochs"]',
     'start_epoch, step = state["epoch"], state["step"]',
     "tests/test_train.py::test_resume_continues_from_the_saved_epoch"),
    ("train.py", "the targets one character further: each position predicts the character after next",
     "src/common/text.py", "targets = tokens[1 : count * seq_len + 1]", "targets = tokens[2 : count * seq_len + 2]",
     GPT + "test_a_target_is_the_next_character_and_no_validation_play_is_trained_on"),
    ("train_FSDP.py", "every rank's sampler given rank 0's shard of the text", "src/train_FSDP.py",
     "num_replicas=world_size, rank=rank, shuffle=True", "num_replicas=world_size, rank=0, shuffle=True",
     GPT + "test_fsdp_two_ranks_of_8_take_train_py_s_steps_of_16_on_text"),
    ("train_TP.py", "the GPT's heads read as all 4 on each rank's half of q, k, v: 4 heads of 16", "src/common/vit.py",
     "proj(x).view(n, t, -1, self.head_dim)", "proj(x).view(n, t, 4, -1)",
     GPT + "test_tensor_parallel_splits_the_causal_heads_and_trains_train_py_s_weights"),
    ("train_muon.py", "every 2-D parameter to Muon: the embeddings and the head orthogonalized too", "src/train_muon.py",
     "matrices = [p for block in model.blocks for p in block.parameters() if p.ndim == 2]",
     "matrices = [p for p in model.parameters() if p.ndim == 2]", MUON),
    ("train_muon.py", "the momentum dropped (momentum=0: the raw gradient orthogonalized)", "src/train_muon.py",
     "momentum=0.95, nesterov=True", "momentum=0.0, nesterov=True", MUON),
    ("train_muon.py", "Muon's momentum cycled by the one-cycle schedule (0.95 to 0.85 and back)", "src/train_muon.py",
     "cycle_momentum=False,  # new #", "cycle_momentum=True,  # new #", MUON),
    ("train_muon.py", "Muon's schedule peaking at AdamW's rate (--lr for both)", "src/train_muon.py",
     "    max_lr=args.muon_lr,\n", "    max_lr=args.lr,\n", MUON),
    ("train_muon.py", "the optimizers not stepped in the same step: Muon after the schedule's step", "src/train_muon.py",
     "        muon.step()  # new # momentum, then its orthogonalized update, for the matrices\n        scheduler.step()\n"
     "        muon_scheduler.step()  # new #",
     "        scheduler.step()\n        muon_scheduler.step()  # new #\n        muon.step()  # new #", MUON),
    ("train_fast.py", "Muon built but never stepped (the second optimizer forgotten in the stack)", "src/train_fast.py",
     "            scaler.step(muon)  # new #", "            pass  # new #", MUON_FAST),
    ("train_fast.py", "Muon's schedule never stepped (its rate stays at the warm-up's start)", "src/train_fast.py",
     "            muon_scheduler.step()  # new #", "            pass  # new #", MUON_FAST),
    ("train_fast.py", "Muon's momentum left out of last.pt (a resume restarts it from zero)", "src/train_fast.py",
     "epoch + 1, step, epochs, scaler=scaler, muon=muon", "epoch + 1, step, epochs, scaler=scaler", MUON_FAST),
    ("bench", "under ISA limits, torch._inductor's import leaves the default cache in TORCHINDUCTOR_CACHE_DIR",
     "src/common/env.py", '        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)\n', "        pass\n",
     "tests/test_bench.py::test_a_bench_under_isa_limits_compiles_into_a_cache_of_its_own"),
    ("setup.sh", "an externally managed Python (PEP 668) taken for one pip installs into", "bench/python.sh",
     "sys.exit(0 if managed else 1)", "sys.exit(1)",
     "tests/test_setup.py::test_an_externally_managed_system_python_gets_a_virtual_environment_in_the_repository"),
    ("setup.sh", "a python3 nobody chose, lacking packages, installed into (another project's versions replaced)",
     "bench/setup.sh", '|| { [ -z "$chosen" ] && [ "$PYTHON" = python3 ]; }; then', "; then",
     "tests/test_setup.py::test_a_python3_that_lacks_packages_is_never_installed_into"),
    ("train_sdpa.py", "the causal mask ignored in the FLOP count (torch's formulas): causal SDPA counted as the whole "
     "T x T product, not FlashAttention-2's lower triangle", "src/common/meter.py",
     "return flops * causal_entries(rows, cols) // (rows * cols) if is_causal else flops", "return flops",
     "tests/test_meter.py::test_the_gpt_s_sdpa_count_is_the_written_out_one_less_its_strict_upper_triangles"),
    ("train_float8.py", "a non-finite check of the logits in the compiled forward (a host sync): a graph break",
     "src/train_float8.py",
     "convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name not in kept)\n",
     "convert_to_float8_training(model, config=config, module_filter_fn=lambda m, name: name not in kept)\n"
     "model.head.register_forward_hook(  # float8 can overflow: stop at the first non-finite logits\n"
     "    lambda module, inputs, logits: common.die('float8: non-finite logits') if not logits.isfinite().all()"
     " else None\n"
     ")\n",
     EQ + "test_float8_emulated_compiles_into_train_compile_s_graphs_with_no_break_in_both_recipes"),
    ("train_fast.py", "Muon back in the GPU ladder's GPT-2 throughput rung (its --without muon dropped, its name kept)",
     "bench/profiles.toml",
     'name = "train_fast.py gpt2, bf16, without Muon"\nscript = "src/train_fast.py"\nargs = ["--model", "gpt2", '
     '"--seq-len", "1024", "--batch-size", "16", "--max-steps", "16", "--warmup-steps", "6",\n        "--test-subset", '
     '"16", "--sample-chars", "0", "--amp-dtype", "bfloat16", "--without", "muon"]',
     'name = "train_fast.py gpt2, bf16, without Muon"\nscript = "src/train_fast.py"\nargs = ["--model", "gpt2", '
     '"--seq-len", "1024", "--batch-size", "16", "--max-steps", "16", "--warmup-steps", "6",\n        "--test-subset", '
     '"16", "--sample-chars", "0", "--amp-dtype", "bfloat16"]',
     "tests/test_bench.py::test_a_transformer_s_throughput_rung_of_train_fast_or_cuda_graphs_runs_without_muon"),
    ("checkpoints", "load_checkpoint's except narrowed back to the errors torch.load names (IndexError, KeyError on "
     "random bytes: a traceback)", "src/common/checkpoint.py",
     "    except Exception as error:  # any bytes: torch.load raises IndexError, KeyError ... as well as its own errors\n",
     "    except (OSError, EOFError, RuntimeError, ValueError, torch.serialization.pickle.UnpicklingError) as error:\n",
     "tests/test_fuzz.py::test_a_damaged_checkpoint_from_before_the_digests_is_one_line_or_a_resume"),
    ("checkpoints", "last.pt loaded without checking its digest (a flipped bit resumes)", "src/common/checkpoint.py",
     "if listed is not None and _sha256_of(f) not in [digest for digest, _ in listed]:",
     "if listed is not None and False:", "tests/test_fuzz.py::test_a_damaged_checkpoint_with_its_digest_is_never_resumed"),
    ("checkpoints", "the DCP folder last.pt names not checked (a damaged shard reaches dcp.load)",
     "src/common/checkpoint.py", "        check_folder(path, state)\n", "        pass\n",
     "tests/test_fuzz.py::test_a_damaged_dcp_folder_is_never_resumed"),
    ("data", "a Fashion-MNIST .gz whose deflate stream is damaged: zlib.error not caught (a traceback)",
     "src/common/data.py", "except (OSError, EOFError, zlib.error) as error:", "except (OSError, EOFError) as error:",
     "tests/test_fuzz.py::test_fashion_mnist_files_of_any_bytes"),
    ("loader.py", "an image whose header says billions of pixels: PIL's DecompressionBombError not caught",
     "src/common/images.py", "except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:",
     "except (OSError, ValueError, SyntaxError) as error:", "tests/test_fuzz.py::test_an_image_file_of_any_bytes"),
    ("data", "the vocabulary checked by its length only (84 characters in another order train on other tokens)",
     "src/common/text.py", "if vocab is None or hashlib.sha256(vocab).hexdigest() != VOCAB_SHA256:",
     "if vocab is None or len(vocab) != 84:",
     "tests/test_fuzz.py::test_the_corpus_and_its_vocabulary_of_any_bytes"),
    ("train_sdpa.py", "the backward ops left unscaled: causal SDPA's backward counted as the whole T x T product, its "
     "forward as the lower triangle", "src/common/meter.py",
     "sdpa_backward_flop_count(grad_out, query, key, value), query[-2], key[-2], causal)",
     "sdpa_backward_flop_count(grad_out, query, key, value), query[-2], key[-2], False)",
     "tests/test_meter.py::test_every_sdpa_kernel_s_aten_ops_count_causal_over_the_lower_triangle"),
    ("checkpoints", "the digest list written with the new file's digest only (a kill before the rename leaves the "
     "old last.pt unlisted: a good file refused)", "src/common/checkpoint.py",
     "_digest_text([new, *(d for d in previous if d != new)], path.name)", "_digest_text([new], path.name)",
     "tests/test_fuzz.py::test_a_save_interrupted_at_any_write_resumes_the_previous_or_the_new_checkpoint"),
    ("train_muon.py", "Newton-Schulz in bfloat16 on every device (torch.optim.Muon's: emulated, slow, on a CPU "
     "without bf16 instructions)", "src/train_muon.py",
     "ns_dtype = torch.bfloat16 if common.native_bfloat16(device) else torch.float32",
     "ns_dtype = torch.bfloat16", NATIVE),
    ("train_fast.py", "bfloat16 autocast by default on a CPU that would emulate it", "src/train_fast.py",
     '"bfloat16" if native_bf16 else "float32")', '"bfloat16")', NATIVE),
    ("train_fast.py", "Muon's Newton-Schulz in bfloat16 on a CPU that would emulate it", "src/train_fast.py",
     "ns_dtype = torch.bfloat16 if native_bf16 else torch.float32", "ns_dtype = torch.bfloat16", NATIVE),
    ("train_amp.py", "bfloat16 autocast by default on a CPU that would emulate it (the ladder's first rung)",
     "src/train_amp.py", '"bfloat16" if native_bf16 else "float32")', '"bfloat16")', NATIVE),
    ("train_muon.py", "native bfloat16 read from oneDNN's check alone (an AVX512 CPU without BF16, Cascade Lake: "
     "emulated bfloat16 taken for native)", "src/common/device.py",
     "return onednn and instructions and any(word in _isa_limit() for word in _BF16_ISA_WORDS)", "return onednn",
     "tests/test_muon.py::test_native_bfloat16_is_onednn_s_check_and_the_instructions_and_no_limit_below_them"),
    ("train_muon.py", "native bfloat16 read from the CPU's flags alone (oneDNN's limit, torch's own test, ignored)",
     "src/common/device.py",
     "return onednn and instructions and any(word in _isa_limit() for word in _BF16_ISA_WORDS)", "return instructions",
     NATIVE),
    ("train_muon.py", "Newton-Schulz cast to bfloat16 whatever dtype it was given", "src/common/optim.py",
     "x = update.to(dtype=dtype, copy=True)", "x = update.to(dtype=torch.bfloat16, copy=True)", NS),
    ("checkpoints", "the folder's lock never taken (two runs write one --checkpoint-dir)", "src/common/cli.py",
     '    if os.environ.get("RANK", "0") == "0":\n        lock_checkpoint_dir(folder)\n', "",
     CKDIR + "test_a_second_run_on_the_folder_is_refused_naming_the_first_and_a_killed_run_s_lock_is_taken_over"),
    ("checkpoints", "--resume with nothing to resume from starts over (the elastic exception for every run)",
     "src/common/cli.py", 'if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) == 0:', "if False:",
     CKDIR + "test_resume_with_nothing_to_resume_from_is_refused_and_deletes_nothing"),
    ("checkpoints", "a missing digest lets any checkpoint load unchecked (deleting last.pt.sha256 switches the check "
     "off)", "src/common/checkpoint.py", 'if state["format"] == 4 and "sharded_sha256" not in state:', "if True:",
     CKDIR + "test_a_checkpoint_without_its_digest_is_refused_unless_its_format_may_predate_the_digests"),
    ("train_FSDP.py", "BatchNorm's statistics saved as each rank holds them in mid-epoch (DCP takes some from rank 1)",
     "src/train_FSDP.py", "        dist.broadcast(buffer, src=0)  # so all hold rank 0's", "        pass  #",
     CKDIR + "test_fsdp_resumes_a_batchnorm_model_bit_for_bit_after_a_sigterm_in_mid_epoch[src/train_FSDP.py]"),
    ("train_FSDP.py", "a sharded save that failed leaves its half-written folder", "src/common/distributed.py",
     "        shutil.rmtree(folder, ignore_errors=True)\n", "",
     CKDIR + "test_a_full_disk_in_a_sharded_save_is_one_line_and_the_last_good_checkpoint_resumes[src/train_FSDP.py]"),
]  # fmt: skip


def check(mutation) -> str | None:
    """Why `mutation` cannot be applied to the current scripts (its old text is not there exactly once, or its test
    is not in its test file), or None."""
    lesson, bug, path, old, new, test = mutation
    text = (REPO / path).read_text()
    if text.count(old) != 1:
        return f"{path}: the text to replace occurs {text.count(old)} times, not once: {old.strip()!r}"
    test_file, name = test.split("::")
    if f"def {name.split('[')[0]}(" not in (REPO / test_file).read_text():
        return f"{test_file} has no test {name}"
    return None


def copy_of_the_project(into: Path) -> Path:
    """src/, tests/, bench/ and requirements.txt copied into `into` (no caches), data/ linked; returns the copy's
    root."""
    root = into / "project"
    for folder in ("src", "tests", "bench"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "requirements.txt", root / "requirements.txt")  # set-up's tests read it
    if (REPO / "data").exists():
        (root / "data").symlink_to(REPO / "data")
    return root


def run_test(root: Path, test: str, timeout_s: int) -> tuple[str, str, float]:
    """(outcome, the lines that say why, seconds) of `pytest TEST` in the copy `root`: passed, failed (exit 1), or
    error (any other exit, a timeout)."""
    started = time.monotonic()
    argv = [sys.executable, "-m", "pytest", test, "-x", "-q", "-p", "no:cacheprovider"]
    try:
        proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "error", f"timed out after {timeout_s} s", time.monotonic() - started
    lines = (proc.stdout + proc.stderr).splitlines()
    outcome = {0: "passed", 1: "failed"}.get(proc.returncode, "error")
    why = [line for line in lines if line.startswith("E ")][:3] or lines[-3:]
    return outcome, "\n".join(why), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="only the bugs whose lesson or description contains this")
    parser.add_argument("--out", type=Path, default=None, help="write table.md, log.txt and env.json here")
    parser.add_argument("--list", action="store_true", help="print the bugs and their tests, run nothing")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per test run")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or any(w in m[0] or w in m[1] for w in args.only)]
    problems = [p for p in map(check, chosen) if p]
    if problems:
        print(f"mutations.py: error: {problems[0]}", file=sys.stderr)
        raise SystemExit(2)
    if not chosen:
        print(f"mutations.py: error: no bug matches --only {' / '.join(args.only)}", file=sys.stderr)
        raise SystemExit(2)
    if args.list:
        for lesson, bug, _, _, _, test in chosen:
            print(f"{lesson}: {bug} -> {test}")
        return
    if args.out is not None and (problem := common.output_problem(args.out, is_folder=True)):
        print(f"mutations.py: error: --out {args.out} {problem}", file=sys.stderr)
        raise SystemExit(2)

    import pandas as pd  # here: --list and the checks need none of it

    rows, log, started = [], [], datetime.now(timezone.utc)
    state, env = common.env.git_state(), common.env.environment()  # the code copied below: what the table is of
    with tempfile.TemporaryDirectory(prefix="mutations-") as scratch:
        root = copy_of_the_project(Path(scratch))
        controls = {}
        for test in dict.fromkeys(m[5] for m in chosen):  # each test once on the unchanged copy: it must pass
            controls[test] = run_test(root, test, args.timeout)
            log.append(f"== control: {test}\n{controls[test][0]} in {controls[test][2]:.0f} s\n{controls[test][1]}\n")
            print(f"control {test.split('::')[-1]}: {controls[test][0]} ({controls[test][2]:.0f} s)", flush=True)
        for lesson, bug, path, old, new, test in chosen:
            original = (root / path).read_text()
            (root / path).write_text(original.replace(old, new))
            try:
                outcome, why, seconds = run_test(root, test, args.timeout)
            finally:
                (root / path).write_text(original)
            control = controls[test][0]
            verdict = "caught" if control == "passed" and outcome == "failed" else "NOT caught"
            if control != "passed":
                verdict += " (the test fails without the bug too)"
            elif outcome == "error":
                verdict += " (the test run did not finish: see the log)"
            how = why.splitlines()[0].removeprefix("E").strip()[:90] if outcome == "failed" else ""
            rows.append({"lesson": lesson, "bug": bug, "test": test.removeprefix("tests/test_equivalence.py::"),
                         "caught": verdict, "how (the test's first failure line)": how,
                         "seconds": round(seconds)})  # fmt: skip
            log.append(f"== {lesson}: {bug}\n-- {old.strip()}\n++ {new.strip()}\n{test}: {outcome} in {seconds:.0f} s\n"
                       f"{why}\n")  # fmt: skip
            print(f"{lesson}: {bug}: {verdict} ({seconds:.0f} s)", flush=True)
    table = pd.DataFrame(rows)
    caught = sum(r["caught"] == "caught" for r in rows)
    text = (
        f"# Mutation table: {caught} of {len(rows)} bugs caught\n\n"
        f"`python tests/mutations.py`, {started:%Y-%m-%d %H:%M} UTC, commit {state['commit']}"
        f"{' (with uncommitted changes)' if state['dirty'] else ''}. Each row: one realistic bug applied to a copy of the "
        "project, and the test that must catch it, run there; caught = the test passes on the copy without the bug "
        "and fails with it. The log has each bug's diff and the test's failure.\n\n" + table.to_markdown(index=False)
    )
    print(text)
    if args.out is not None:
        common.io.atomic_write_text(args.out / "table.md", text + "\n")
        common.io.atomic_write_text(args.out / "log.txt", "\n".join(log))
        common.io.atomic_write_text(args.out / "env.json", json.dumps(env, indent=2) + "\n")
    raise SystemExit(0 if caught == len(rows) else 1)


def _interrupted(signum, frame):
    """SIGTERM (a killed job, `timeout`) as Ctrl-C: the copy's temporary folder is removed and nothing is written."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        main()
    except KeyboardInterrupt:
        print("mutations.py: interrupted (Ctrl-C or SIGTERM); nothing written", file=sys.stderr)
        raise SystemExit(130) from None
