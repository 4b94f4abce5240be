# Prints, from `go test -v` output, the lines of each top-level test that
# failed: a header line (=== RUN/CONT/NAME/PAUSE) says whose lines follow;
# a package's lines are held until its closing line, and printed only if it
# is "FAIL<tab>package", so a passing namesake in another package stays out.
function flush(keep,   i) { if (keep) for (i = 1; i <= nbuf; i++) print buf[i]; nbuf = 0; delete failed }
/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; sub(/\/.*/, "", cur) }
match($0, /--- FAIL: [^ ]+/) { n = substr($0, RSTART + 10, RLENGTH - 10); sub(/\/.*/, "", n); failed[n] = 1 }
# A package that timed out prints no FAIL line for its tests: they are the
# ones "panic: test timed out" lists as still running.
/^\trunning tests:/ { running = 1; next }
running && /^\t\t[^ ]+ \(/ { n = $1; sub(/\/.*/, "", n); failed[n] = 1 }
running && !/^\t\t/ { running = 0 }
/^(ok|FAIL)[ \t]/ {
	keep = ($0 ~ /^FAIL\t/)
	if (keep) { for (i = 1; i <= nall; i++) if (who[i] in failed) buf[++nbuf] = who[i] ": " all[i] }
	flush(keep); nall = 0; cur = ""; next
}
cur != "" { all[++nall] = $0; who[nall] = cur }
