"""What ray_gpt.py prints at start: the resolved config, keys with no effect here, the placement plan."""
from __future__ import annotations


def resolved_yaml(cfg) -> str:
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(cfg.to_dict()))


def ignored_lines(cfg, platform) -> list[str]:
    """One line per key that is accepted but has no effect on this platform (reported once)."""
    lines = []
    platform_name = platform.name
    if not platform.uses_mindspeed:
        switches = sorted({k for role in (cfg.actor, cfg.ref, cfg.reward) for k in role.mindspeed_switches})
        if switches:
            lines.append(f"MindSpeed switches, used on NPU only, ignored on {platform_name}: {', '.join(switches)}")
    for key, why in sorted(cfg.ignored.items()):
        lines.append(f"{key}: no effect here ({why})")
    return lines


def print_run_summary(cfg, plan) -> None:
    from mindspeed_rl.distributed.plan import format_plan
    from mindspeed_rl.platform import get_platform

    platform = get_platform(cfg.run.platform)
    print(f"# resolved config ({cfg.config_name})")
    print(resolved_yaml(cfg))
    for line in ignored_lines(cfg, platform):
        print(f"note: {line}")
    print(f"# placement plan (platform {platform.name}, Ray resource {platform.ray_resource!r})")
    print(format_plan(plan, platform.ray_resource))
    if platform.name == "cpu":
        import os

        from mindspeed_rl.distributed.plan import format_threads, host_cpus_per_device, placement_groups
        need = sum(n for _, n in placement_groups(plan))
        local = max(os.cpu_count() or 1, need)
        threads = host_cpus_per_device(plan, {"local": need}, {"local": local})
        print(format_threads(threads, f"a local instance: {local} CPUs over {need} device bundle(s); "
                                      "a joined cluster: its nodes' CPUs"))
    print(f"output directory: {cfg.run.output_dir}")


