# devtag in the initramfs: the metadata document -> what the shell script resolves and writes.
#
# Tags are hostile input: every entry is checked against the rules of
# schema/device-role-tagging-1.json (the same as the agent's jsonschema check;
# anchored with \A and \z, never $), and only checked, encoded text leaves this
# filter.  Modes (--arg mode ...):
#
#   entries  one line per valid, tagged disk entry, fields separated by one space:
#            INDEX BUS ADDRESS PCI_PATH CONTROLLER_BUS CONTROLLER_ADDRESS CONTROLLER_PCI_PATH SERIAL
#            ("-" for an absent field; every field matches a pattern without spaces;
#            a serial outside [A-Za-z0-9._:+@-] is "-": the initramfs matches only plain serials)
#   db       with --argjson disks {"<key>": [I, ...], ...} (per disk, the entries that
#            resolved to it): each disk's udev "KEY=value" file, byte for byte what
#            devtag-agent writes (devtag_agent.state.db_file_text), with the tags
#            outside ASCII left out (the agent adds them after switch-root); one
#            "<key> <line>" output line per line of the file.  Keys must match
#            b<major>:<minor>:<diskseq> (digits only), or the disk is skipped.
#   db       with --argjson indices [I, ...] instead: one file's text (tests).

def re($p): type == "string" and test($p);
def opt($k; f): (has($k) | not) or (.[$k] | f);
def integer: type == "number" and . == floor;
def no_controls: explode | all(. > 31 and (. < 127 or . > 159));
def name_ok: re("\\A[a-z][a-z0-9_-]{0,31}\\z");
def pci_address_ok: re("\\A([0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]|none)\\z");
def pci_path_ok: re("\\A[0-9a-f]{2}:[01][0-9a-f]\\.[0-7](/[01][0-9a-f]\\.[0-7]){0,15}\\z");
def tag_ok:
  type == "string" and length >= 1 and length <= 60
  and (explode | all(. > 31 and (. < 127 or . > 159) and . != 44 and . != 47));
def controller_ok:
  type == "object" and has("type") and has("index")
  and (.type | name_ok) and (.index | integer and . >= 0 and . <= 65535)
  and opt("model"; re("\\A[a-z0-9][a-z0-9_.-]{0,63}\\z")) and opt("bus"; name_ok)
  and opt("address"; pci_address_ok) and opt("pci_path"; pci_path_ok);
def bus_address_ok:
  if has("address") | not then true
  else .address as $a
  | {"pci": "\\A([0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\\.[0-7]|none)\\z",
     "scsi": "\\A([0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}:[0-9]{1,5}|none)\\z",
     "ide": "\\A([01]:[01]|none)\\z",
     "sata": "\\A([0-9]{1,3}:[0-9]{1,2}|none)\\z",
     "usb": "\\A([0-9]{1,3}:[0-9]{1,3}(\\.[0-9]{1,3}){0,4}|none)\\z",
     "xen": "\\A([0-9]{1,6}|none)\\z",
     "none": "\\Anone\\z"}[.bus] as $p
  | $p == null or ($a | re($p))
  end;
def share_ok:
  .type != "share"
  or (opt("share_id"; type == "string" and length >= 1 and length <= 255 and no_controls)
      and opt("tag"; type == "string" and length >= 1 and length <= 255 and no_controls));
def entry_ok:
  type == "object" and has("type") and has("bus")
  and (.type | name_ok) and (.bus | name_ok)
  and opt("address"; re("\\A[0-9a-z][0-9a-z:.]{0,63}\\z"))
  and opt("pci_path"; pci_path_ok)
  and opt("controller"; controller_ok)
  and opt("mac"; re("\\A[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}\\z"))
  and opt("serial"; . == null or (type == "string" and length <= 256 and no_controls))
  and opt("path"; re("\\A/dev/[A-Za-z0-9._+:@/-]{1,200}\\z") and (test("/\\.\\.?(/|\\z)") | not))
  and opt("devname"; re("\\A[A-Za-z0-9][A-Za-z0-9._@+-]{0,14}\\z"))
  and opt("vlan"; integer and . >= 0 and . <= 4095)
  and opt("vf_trusted"; type == "boolean")
  and opt("acpi_index"; integer and . >= 1 and . <= 16383)
  and opt("tags"; type == "array" and length <= 64 and (unique | length) == length and all(tag_ok))
  and (.type != "nic" or has("mac"))
  and bus_address_ok and share_ok;

# The first 4096 entries (the schema's maxItems; the agent uses as many), with their positions.
def entries:
  if type == "object" and (.devices | type) == "array"
  then .devices[:4096] | to_entries[] | select(.value | entry_ok) | {index: .key} + .value
  else empty end;

def field: if . == null or . == "" then "-" else tostring end;

# devtag_agent.encoding for ASCII tags: keep the safe characters, \xNN the rest, and
# also a leading "." and the "-" of a trailing "-part<N>".
def hex: "0123456789abcdef"[(. / 16 | floor):(. / 16 | floor) + 1] + "0123456789abcdef"[(. % 16):(. % 16) + 1];
def encode($safe):
  . as $tag
  | ([match("-part[0-9]+\\z")] | if length > 0 then .[0].offset else -1 end) as $dash
  | [explode | to_entries[]
     | .key as $i | .value as $c
     | if ($safe | index([$c])) != null and $i != $dash and ($i != 0 or $c != 46)
       then [$c] | implode else "\\x" + ($c | hex) end]
  | join("");
def name_safe: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789#+-.:=@_" | explode;
def key_safe: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+-.:@_" | explode;
def ascii: explode | all(. < 128);

# The agent's merge: tags of the entries in order, each once, at most 64 (the schema's per-entry limit).
def merged($entries):
  reduce ($entries[] | .tags // [] | .[]) as $t ([];
    if index([$t]) != null or length >= 64 then . else . + [$t] end);

def db_text($entries):
  [merged($entries)[] | select(ascii)] as $tags
  | if ($tags | length) == 0 then empty
    else
      (["# devtag-agent: device role tags (encoded, see docs/agent.md)",
        "DEVTAG_TAGS=" + ([$tags[] | encode(name_safe)] | join(" "))]
       + [$tags[] | "DEVTAG_TAG_" + encode(key_safe) + "=1"]
       + ([$tags[] | encode(name_safe) | select(utf8bytelength <= 240)]
          | to_entries | map("DEVTAG_LINK_\(.key + 1)=\(.value)")))
      | join("\n")
    end;

($ARGS.named.mode // "") as $mode
| ($ARGS.named.indices // []) as $indices
| ($ARGS.named.disks // null) as $disks
| if $mode == "entries" then
  entries
  | select(.type == "disk" and (.tags // [] | length) > 0)
  | [.index, .bus, (.address | field), (.pci_path | field),
     (.controller.bus // "pci" | field), (.controller.address | field), (.controller.pci_path | field),
     (.serial | if type == "string" and test("\\A[A-Za-z0-9._:+@-]{1,256}\\z") then . else "-" end)]
  | map(tostring) | join(" ")
elif $mode == "db" and $disks != null then
  [entries] as $all
  | $disks | to_entries[]
  | select(.key | test("\\Ab[0-9]{1,10}:[0-9]{1,10}:[0-9]{0,20}\\z"))
  | .key as $key | .value as $wanted
  | db_text([$all[] | select(.index as $i | $wanted | index([$i]) != null)])
  | split("\n")[] | "\($key) \(.)"
elif $mode == "db" then
  [entries] as $all
  | db_text([$all[] | select(.index as $i | $indices | index([$i]) != null)])
else
  error("mode: entries or db")
end
