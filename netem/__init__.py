"""Link emulation: the userspace link and its toxics, link profiles, the tc backend and the links' control
API: what the ocean does to a byte between Lagos and a region (ARCHITECTURE.md, "netem")."""
