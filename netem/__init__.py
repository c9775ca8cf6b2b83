"""Link emulation, topologies and scenarios: what a user in Lagos feels (see DESIGN.md)."""
