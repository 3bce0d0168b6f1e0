"""gpufrag: the shared base every component depends on, and the ``gpufrag`` command.

Input errors and exit codes (:mod:`gpufrag.errors`), logging (:mod:`gpufrag.logs`), resource,
label and annotation names and conventions (:mod:`gpufrag.conventions`), the NVML adapter and
its recorded stand-in (:mod:`gpufrag.nvml`, :mod:`gpufrag.nvml_recorded`), the probes and stop
signals of long-running processes (:mod:`gpufrag.probes`), the one HTTP server every listener
uses, its reloading TLS and its bound on connections (:mod:`gpufrag.httpserve`,
:mod:`gpufrag.tls`, :mod:`gpufrag.connlimit`), the event-loop choice (:mod:`gpufrag.loops`),
the signed GPU records (:mod:`gpufrag.records`), and the CLI
entry point
(:mod:`gpufrag.cli`), which sits at the top of the layers and names every subcommand's module
as a string.
"""
