#!/bin/bash
# $1 sass file, $2 function -> decoded ctl lines of that function
awk -v f="$2" '/Function : /{p=($3==f)} p' $1 > /tmp/c20/fn.sass
python3 $3/ctl.py /tmp/c20/fn.sass
