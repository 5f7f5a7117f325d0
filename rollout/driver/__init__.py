"""The driver engine: what rollout knows of the NVIDIA driver on a node and in the cluster.

Models, pure parsers and the facts that read them (each a command and its parser, in the frame
of rollout.fact); the only side effects are the `CommandRunner` a fact is read through and the
`KubeClient` the NVIDIADriver resources are listed with. It imports no change kind: the
driver-upgrade change kind (rollout.changes.driver), the node facts (rollout.facts.model, which
carries DriverStatus, DriverKernel and DriverHost), diagnose and the shared reboot step
(rollout.steps.reboot) import it. Nothing is re-exported here: name the module.

- status: `DriverStatusFact` (`nvidia-smi -L` with its exit code) -> `DriverStatus` (`.ok`,
  `.library_mismatch`); `DriverKernelFact` (`uname -r`, the nvidia module loaded and the one
  installed for the kernel) -> `DriverKernel` (`.mismatch`); `split_exit_code`.
- host: what a `mode: host` upgrade reads of a node: `DriverVersionFact` (nvidia-smi's
  version), `InstalledPackagesFact` (dpkg), `HeldPackagesFact` (apt-mark), `AptVersionsFact`
  (apt-cache madison), `SecureBootFact` (mokutil); `DriverHost`, read by
  `read_driver_host(runner, packages, version)` or from recorded texts by
  `driver_host_from_raw(raw)` (`RAW_KEYS`); `signed_module_package(driver, kernel)`.
- modules: the node's processes and kernel: `GpuClientsFact` (nvidia-persistenced,
  nvidia-fabricmanager) -> `UnitState`s, `LoadedModulesFact` (lsmod) -> `LoadedModule`s,
  `unload_order(modules)` (rmmod's order), `BootIdFact` (the proof that a node rebooted).
- operator: the GPU Operator's driver as the ClusterPolicy or an NVIDIADriver states it:
  `OperatorDriver` (`.from_cluster_policy(spec)`, `.with_nvidia_driver(name, spec)`),
  `DriverSource`, `UpgradePolicyFacts`; the upgrade controller's labels and states
  (`upgrade_state`, `is_pinned`, `served_by_driver_daemonset`, `OPERAND_PAUSED`).
- operatorlive: `read_nvidia_drivers(kube)`, the NVIDIADriver resources read live (only for a
  plan whose change names one: the driver kind's `reads_nvidia_drivers`).
"""
