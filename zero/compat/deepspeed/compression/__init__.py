"""deepspeed.compression: only its deprecated `helper` module, which DeepSpeed-Chat imports; zero
builds none of DeepSpeed's compression methods (DeepSpeed 0.19.8 has dropped them too)."""
