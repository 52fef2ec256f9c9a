"""What every training script shares, and nothing that belongs to one technique: a package of one-job modules.

The scripts (`train.py`, `train_*.py`, `loader*.py`) keep their training loop in the file, so that a diff shows a
technique in context; they use what is here as `common.X`, and this file re-exports exactly those names. No function
here asks which technique calls it. Importing the package changes nothing global: `parse_args()`, which only the
scripts call, installs the excepthook that turns the failures a user causes into one line on stderr.

The map: each module, what it owns, and [what it imports from the package]. No module imports a script; no circle
(tests/test_imports.py fails on one, in src/common/ and in bench/).

    errors      die (one line on stderr, an exit code), first_line, the one-line excepthook          []
                (install_error_hook, which parse_args installs) and the types it reports:
                BadImage (images raise it), WriteFailed (io raises it)
    io          atomic_write / atomic_write_text, output_problem (a probe write)                     [errors]
    env         REPO; environment(): versions, cpu_info (bf16 instruction sets), GPUs, git commit;  [device, errors]
                in_process_group, require_torch
    device      get_device, precision_label (what an fp32 model really computes in),               [errors]
                native_bfloat16 (bfloat16 in hardware, not emulated), bfloat16_emulated (why not)
    optim       Muon: torch.optim.Muon, its Newton-Schulz in a dtype of choice; newton_schulz      []
    seeding     seed_everything (and --deterministic), seed_worker (DataLoader workers)             []
    data        Fashion-MNIST (find_fashion_mnist, read_idx, load_data), the text's (load_data),    [env, errors,
                synthetic_data, input_shape                                                         models, text]
    images      the loaders' ImageFolder: image_folders, load_rgb, find_non_image                   [errors]
    dali        loader.py's pipeline as one DALI graph (image_pipeline) and DALILoader, its batches [errors, images]
                as a DataLoader's; require_dali (the lazy import: one line when not installed)
    models      build_model (cnn, mlp, resnet18, resnet50, vit, gpt, gpt2, gpt-wide), MODELS,       [gpt, vit]
                TEXT_MODELS, vit_patch_size
    vit         the ViT and the transformer block the GPT shares (causal or not)                    []
    gpt         the GPT (token + position embeddings, causal blocks, LM head), GPT_CONFIGS          [vit]
    text        Shakespeare as character tokens (check_corpus, shakespeare, blocks), generate       [env]
    evaluation  evaluate: test loss and accuracy                                                    []
    target      --target-loss: the probe of a held-out sample's loss every K steps, clock stopped   [data, errors,
                (target_probe, which a script hands its Meter; check, record, fields)                models]
    meter       Meter (images/s, step times, data-wait, activations, FLOPs), memory_stats,
                gather_summary (over ranks), StageClock (a pipeline rank's bubble, Meter's),       []
                flop_counter (every FLOP count's: causal attention as the causal kernel runs it)
    runstate    RunState: one run's failed checkpoint writes, last save, SIGTERM step; its status  []
    metrics     epoch_record, epoch_line, report (the closing line), write_metrics (the JSON)       [data, device, env,
                                                                                                     errors, gpt, io,
                                                                                                     meter, target]
    checkpoint  save_checkpoint, load_checkpoint (its refusals), load_part, exit_if_finished,      [env, errors, io,
                lock_checkpoint_dir (one run owns a folder)                                          models]
    preemption  Preemption: SIGTERM stops every rank at one step boundary; init_worker, the         [env, errors,
                DataLoader workers' (seeded, SIGTERM from others ignored)                            runstate, seeding]
    distributed setup (train_DDP.py's torchrun set-up, for the scripts that do not teach it),
                save_full_state / load_full_state (a sharded model's whole state in last.pt),
                sync_stages / save_stages (a pipeline's), sum_over_ranks (a tensor summed over the   [checkpoint, env,
                ranks), sharded_save_failed (a DCP save that raised: one line, exit 1)               errors, runstate]
    cli         the shared flags (get_parser, get_image_folder_parser), parse_args (the checks made [checkpoint, data,
                before any work, each model's defaults; check_checkpoint_dir: the folder's lock,    env, errors, io,
                --resume with something to resume; args.run, the run's RunState)                    models, runstate,
                                                                                                     target]

The bench and the tests reach the rest through the module that owns it, e.g. `common.io.atomic_write_text` or
`common.data.find_fashion_mnist`.
"""

from . import (  # noqa: F401  (the modules, as common.io, common.data ...)
    checkpoint,
    cli,
    dali,
    data,
    device,
    distributed,
    env,
    errors,
    evaluation,
    gpt,
    images,
    io,
    meter,
    metrics,
    models,
    optim,
    preemption,
    runstate,
    seeding,
    target,
    text,
    vit,
)
from .checkpoint import exit_if_finished, load_checkpoint, load_part, save_checkpoint
from .cli import get_image_folder_parser, get_parser, non_negative_int, parse_args, positive_int
from .dali import DALILoader, require_dali
from .data import input_shape, load_data, synthetic_data
from .distributed import save_stages, sync_stages
from .device import get_device, native_bfloat16, precision_label
from .errors import BadImage, die
from .evaluation import evaluate
from .gpt import GPT
from .images import IMAGENET_MEAN, IMAGENET_STD, find_non_image, image_folders, load_rgb
from .io import output_problem
from .meter import Meter, flop_counter, gather_summary
from .metrics import epoch_line, epoch_record, report
from .models import TEXT_MODELS, build_model
from .optim import Muon
from .preemption import Preemption, init_worker
from .seeding import seed_everything, seed_worker
from .target import target_probe
from .text import generate
from .vit import ViT

__all__ = [
    "BadImage",
    "DALILoader",
    "GPT",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Meter",
    "Muon",
    "Preemption",
    "TEXT_MODELS",
    "ViT",
    "build_model",
    "die",
    "epoch_line",
    "epoch_record",
    "evaluate",
    "exit_if_finished",
    "find_non_image",
    "flop_counter",
    "gather_summary",
    "generate",
    "get_device",
    "get_image_folder_parser",
    "get_parser",
    "image_folders",
    "init_worker",
    "input_shape",
    "load_checkpoint",
    "load_part",
    "load_data",
    "load_rgb",
    "native_bfloat16",
    "non_negative_int",
    "output_problem",
    "parse_args",
    "positive_int",
    "precision_label",
    "report",
    "require_dali",
    "save_checkpoint",
    "save_stages",
    "seed_everything",
    "seed_worker",
    "sync_stages",
    "synthetic_data",
    "target_probe",
]
