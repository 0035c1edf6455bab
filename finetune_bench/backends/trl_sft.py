"""TRL's SFTTrainer on prompt/completion data (completion-only loss): the blog's setup.

TRL 1.16 computes the loss with its own chunked LM-head log-probabilities whatever Liger does,
so a liger arm here replaces the layer kernels (RoPE, RMSNorm, SwiGLU/GeGLU) only; the loss path
is recorded as `trl_chunked_lm_head` for both arms.
"""

from pathlib import Path

import torch

from finetune_bench import sources
from finetune_bench.backends.common import load_model, run_details
from finetune_bench.backends.trainer_common import recording_callback, recording_trainer, training_arguments
from finetune_bench.measure import StepRecorder
from finetune_bench.spec import TrainingArgs

LOSS_PATH = "trl_chunked_lm_head"


def train(
    args: TrainingArgs,
    dataset_dir: Path,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    recorder: StepRecorder,
    work_dir: Path,
) -> dict:
    from trl import SFTConfig, SFTTrainer

    loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
    recorder.attach_model(loaded.model)
    dataset = sources.load_prompt_completion(dataset_dir)
    config = SFTConfig(
        **training_arguments(args, device, dtype, work_dir),
        max_length=args.max_seq_length,
        packing=False,
        dataset_num_proc=None,
    )
    trainer = recording_trainer(SFTTrainer, recorder)(
        model=loaded.model,
        args=config,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        callbacks=[recording_callback(recorder)],
    )
    trainer.train()
    return run_details(loaded, LOSS_PATH)
