# TTFT p90 against offered QPS, one line per policy, log-scale y.
#   gnuplot -e "datafile='ttft.dat'; outfile='ttft.png'; ncols=7; \
#               subtitle='...'" bench/e2e/plot.gp
# datafile: whitespace separated, header line "qps policy1 policy2 ...",
# NaN where a stage had no completed request.

if (!exists("subtitle")) subtitle = ""

set terminal pngcairo size 1000,640 font "sans,11" noenhanced
set output outfile
set title "TTFT p90 vs QPS, shared-prefix (uncompressed seconds)\n".subtitle
set xlabel "offered QPS (uncompressed)"
set ylabel "TTFT p90 (s)"
set logscale y
set format y "%g"
set grid xtics ytics mytics
set key outside right top
set datafile missing "NaN"

plot for [i=2:ncols] datafile using 1:i with linespoints lw 2 pt (i+4) \
    title columnheader(i)
