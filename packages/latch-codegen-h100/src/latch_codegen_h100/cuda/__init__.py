"""The megakernel run-time headers (package data): table records, sync primitives, the kernel and
its C ABI."""
