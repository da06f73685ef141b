"""One module per Ansible role, named like the role: its typed plan (what it writes, what it runs, what cannot be done
on this host and why) and the judgement its checks make. The L3 mount is storage (plan, options, gates) and
storage_live (mountinfo, mountstats, multipath, judged). plan: what every role's plan shares; launch: SGLang's command
line (the sglang_server role's); host_files: every file the roles leave on a host (render). Imports rules, config, formats."""
