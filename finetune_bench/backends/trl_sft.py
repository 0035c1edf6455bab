"""TRL's SFTTrainer on prompt/completion data (completion-only loss): the blog's setup.

TRL 1.16 computes the loss with its own chunked LM-head log-probabilities whatever Liger does,
so a liger arm here replaces the layer kernels (RoPE, RMSNorm, SwiGLU/GeGLU) only; the loss path
is recorded as `trl_chunked_lm_head` for both arms.
"""

from pathlib import Path

import torch

from finetune_bench import faults, sources
from finetune_bench.backends.common import load_model
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
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    loaded = load_model(args, model_dir, device, dtype, fused_linear_cross_entropy=False, cross_entropy=False)
    recorder.attach_model(loaded.model)
    dataset = sources.load_prompt_completion(dataset_dir)

    class RecordingCallback(TrainerCallback):
        def on_train_begin(self, *_, **__):
            recorder.begin_training()

        def on_step_end(self, _args, state, *_, **__):
            recorder.end_step()
            faults.maybe_inject(state.global_step)

        def on_log(self, _args, state, _control, logs=None, **__):
            if logs and "loss" in logs:
                recorder.record_loss(state.global_step, float(logs["loss"]))

    class RecordingSFTTrainer(SFTTrainer):
        def training_step(self, model, inputs, *rest, **kwargs):
            recorder.add_batch(inputs.get("attention_mask"), inputs["input_ids"])
            return super().training_step(model, inputs, *rest, **kwargs)

    config = SFTConfig(
        output_dir=str(work_dir / "trainer"),
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_steps=args.max_steps,
        max_length=args.max_seq_length,
        learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_ratio,
        weight_decay=args.weight_decay,
        optim=args.optim,
        seed=args.seed,
        data_seed=args.seed,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        gradient_checkpointing=args.gradient_checkpointing,
        use_cpu=device.type == "cpu",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        packing=False,
        dataset_num_proc=None,
    )
    trainer = RecordingSFTTrainer(
        model=loaded.model,
        args=config,
        train_dataset=dataset,
        processing_class=loaded.tokenizer,
        callbacks=[RecordingCallback()],
    )
    trainer.train()
    return {
        "loss_path": LOSS_PATH,
        "liger_patches": loaded.liger_patches,
        "random_init": loaded.random_init,
        "attn_implementation": str(getattr(loaded.model.config, "_attn_implementation", "")),
        "num_parameters": int(sum(p.numel() for p in loaded.model.parameters())),
    }
