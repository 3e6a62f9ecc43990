# llama-server 3.22.1 loses a SIGTERM that arrives as its task loop starts: the deterministic form of
# what tests/oracle/sigterm_race.py measures (docs/serve.md, "Shutdown").
#
#   gdb -batch -x tests/oracle/sigterm_lost.gdb --args LLAMA_SERVER -m MODEL --port 18977 ...
#   curl 127.0.0.1:18977/health    # still {"status":"ok"} seconds after the SIGTERM; kill -9 it
#
# Its handler (installed after /health turns 200) calls server_queue::terminate(), which clears
# `running`; server_queue::start_loop() then sets `running = true` and waits for tasks for good.
set pagination off
handle SIGTERM nostop noprint pass
break server_queue::start_loop
run
printf "at server_queue::start_loop: SIGTERM to itself\n"
call (int)kill((int)getpid(), 15)
delete
continue
