"""`deepspeed.checkpoint.ds_to_universal`: a checkpoint, zero's or DeepSpeed's, made into
DeepSpeed's universal checkpoint (zero/checkpoint_to_universal.py), under DeepSpeed's command:

    python -m deepspeed.checkpoint.ds_to_universal --input_folder DIR/global_step10 \\
        --output_folder DIR/global_step10_universal
"""
from zero.checkpoint_to_universal import main, parse_arguments

__all__ = ["main", "parse_arguments"]

if __name__ == "__main__":
    main(parse_arguments())
