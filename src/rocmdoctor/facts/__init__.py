"""Facts about GPUs that checks and provisioning share: bundle families per gfx, which GPUs vLLM serves on
a host with several, where the deep probe ships. Pure knowledge; reads go through `rocmdoctor.host`."""
