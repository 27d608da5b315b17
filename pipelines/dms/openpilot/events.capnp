# The openpilot messages the DMS service reads and writes, wire-compatible with cereal's.
#
# Written from cereal's facts (log.capnp, custom.capnp), not copied from them. Cap'n Proto places
# every field by the fields declared before it: a union member's discriminant is its index among
# the union's members in ordinal order, and each field's offset is allocated in ordinal order by
# its kind and width. So each struct here declares every field from @0 to the highest one used,
# with cereal's kind and width (deprecated ones too, under their own names), and the Event union
# declares every member from @1 to the highest one used: the members not used here are
# placeholders of a pointer kind, as every member of cereal's union is a pointer. Events whose
# member lies beyond @107 (cereal has members up to @154) are not in this schema; readers skip
# them. Follows cereal as of openpilot 0.9.x-0.10.x (log.capnp with cabinCameraState @70 and
# driverStateV2 @92); older schemas name @70 and @76 driverCameraState and driverEncodeIdx.

@0xe8995f71d6d08a4a;

struct Event {
  logMonoTime @0 :UInt64;  # ns, monotonic clock: when the message was published
  valid @67 :Bool = true;  # stored XOR its default

  union {
    unused1 @1 :AnyPointer;
    unused2 @2 :AnyPointer;
    unused3 @3 :AnyPointer;
    unused4 @4 :AnyPointer;
    unused5 @5 :AnyPointer;
    unused6 @6 :AnyPointer;
    unused7 @7 :AnyPointer;
    unused8 @8 :AnyPointer;
    unused9 @9 :AnyPointer;
    unused10 @10 :AnyPointer;
    unused11 @11 :AnyPointer;
    unused12 @12 :AnyPointer;
    unused13 @13 :AnyPointer;
    unused14 @14 :AnyPointer;
    unused15 @15 :AnyPointer;
    unused16 @16 :AnyPointer;
    unused17 @17 :AnyPointer;
    unused18 @18 :AnyPointer;
    unused19 @19 :AnyPointer;
    unused20 @20 :AnyPointer;
    unused21 @21 :AnyPointer;
    unused22 @22 :AnyPointer;
    unused23 @23 :AnyPointer;
    unused24 @24 :AnyPointer;
    unused25 @25 :AnyPointer;
    unused26 @26 :AnyPointer;
    unused27 @27 :AnyPointer;
    unused28 @28 :AnyPointer;
    unused29 @29 :AnyPointer;
    unused30 @30 :AnyPointer;
    unused31 @31 :AnyPointer;
    unused32 @32 :AnyPointer;
    unused33 @33 :AnyPointer;
    unused34 @34 :AnyPointer;
    unused35 @35 :AnyPointer;
    unused36 @36 :AnyPointer;
    unused37 @37 :AnyPointer;
    unused38 @38 :AnyPointer;
    unused39 @39 :AnyPointer;
    unused40 @40 :AnyPointer;
    unused41 @41 :AnyPointer;
    unused42 @42 :AnyPointer;
    unused43 @43 :AnyPointer;
    unused44 @44 :AnyPointer;
    unused45 @45 :AnyPointer;
    unused46 @46 :AnyPointer;
    unused47 @47 :AnyPointer;
    unused48 @48 :AnyPointer;
    unused49 @49 :AnyPointer;
    unused50 @50 :AnyPointer;
    unused51 @51 :AnyPointer;
    unused52 @52 :AnyPointer;
    unused53 @53 :AnyPointer;
    unused54 @54 :AnyPointer;
    unused55 @55 :AnyPointer;
    unused56 @56 :AnyPointer;
    unused57 @57 :AnyPointer;
    unused58 @58 :AnyPointer;
    unused59 @59 :AnyPointer;
    unused60 @60 :AnyPointer;
    unused61 @61 :AnyPointer;
    unused62 @62 :AnyPointer;
    unused63 @63 :AnyPointer;
    unused64 @64 :AnyPointer;
    unused65 @65 :AnyPointer;
    unused66 @66 :AnyPointer;
    unused68 @68 :AnyPointer;
    unused69 @69 :AnyPointer;
    cabinCameraState @70 :FrameData;  # the cabin (driver) camera's state; named driverCameraState in older schemas
    unused71 @71 :AnyPointer;
    unused72 @72 :AnyPointer;
    unused73 @73 :AnyPointer;
    unused74 @74 :AnyPointer;
    unused75 @75 :AnyPointer;
    cabinEncodeIdx @76 :EncodeIndex;  # the cabin video's encode index; named driverEncodeIdx in older schemas
    unused77 @77 :AnyPointer;
    unused78 @78 :AnyPointer;
    unused79 @79 :AnyPointer;
    unused80 @80 :AnyPointer;
    unused81 @81 :AnyPointer;
    unused82 @82 :AnyPointer;
    unused83 @83 :AnyPointer;
    unused84 @84 :AnyPointer;
    unused85 @85 :AnyPointer;
    unused86 @86 :AnyPointer;
    unused87 @87 :AnyPointer;
    unused88 @88 :AnyPointer;
    unused89 @89 :AnyPointer;
    unused90 @90 :AnyPointer;
    unused91 @91 :AnyPointer;
    driverStateV2 @92 :DriverStateV2;  # the driver-monitoring model's outputs
    unused93 @93 :AnyPointer;
    unused94 @94 :AnyPointer;
    unused95 @95 :AnyPointer;
    unused96 @96 :AnyPointer;
    unused97 @97 :AnyPointer;
    unused98 @98 :AnyPointer;
    unused99 @99 :AnyPointer;
    unused100 @100 :AnyPointer;
    unused101 @101 :AnyPointer;
    unused102 @102 :AnyPointer;
    unused103 @103 :AnyPointer;
    unused104 @104 :AnyPointer;
    unused105 @105 :AnyPointer;
    unused106 @106 :AnyPointer;
    dmsStatus @107 :DmsStatus;  # ours: cereal's customReserved0, the first member reserved for forks
  }
}

struct DriverStateV2 {
  frameId @0 :UInt32;
  modelExecutionTime @1 :Float32;
  dspExecutionTimeDEPRECATED @2 :Float32;
  rawPredictions @3 :Data;
  poorVisionProbDEPRECATED @4 :Float32;
  wheelOnRightProb @5 :Float32;
  leftDriverData @6 :DriverData;
  rightDriverData @7 :DriverData;
  gpuExecutionTime @8 :Float32;
}

struct DriverData {
  faceOrientation @0 :List(Float32);
  faceOrientationStd @1 :List(Float32);
  facePosition @2 :List(Float32);
  facePositionStd @3 :List(Float32);
  faceProb @4 :Float32;
  leftEyeProb @5 :Float32;
  rightEyeProb @6 :Float32;
  leftBlinkProb @7 :Float32;
  rightBlinkProb @8 :Float32;
  sunglassesProb @9 :Float32;
  occludedProbDEPRECATED @10 :Float32;
  readyProbDEPRECATED @11 :List(Float32);
  notReadyProbDEPRECATED @12 :List(Float32);
  phoneProb @13 :Float32;
  sleepProb @14 :Float32;
}

# A camera's state for one frame (cereal's FrameData): ids and timestamps (ns, the device's clock).
struct FrameData {
  frameId @0 :UInt32;
  encodeId @1 :UInt32;
  timestampEof @2 :UInt64;
  frameLengthDEPRECATED @3 :Int32;
  integLines @4 :Int32;
  globalGainDEPRECATED @5 :Int32;
  image @6 :Data;
  frameTypeDEPRECATED @7 :UInt16;  # an enum in cereal: 16 bits
  timestampSof @8 :UInt64;
  androidCaptureResultDEPRECATED @9 :AnyPointer;
  transform @10 :List(Float32);
  lensPosDEPRECATED @11 :Int32;
  lensSagDEPRECATED @12 :Float32;
  lensErrDEPRECATED @13 :Float32;
  lensTruePosDEPRECATED @14 :Float32;
  gain @15 :Float32;
  focusValDEPRECATED @16 :List(Int16);
  focusConfDEPRECATED @17 :List(UInt8);
  sharpnessScoreDEPRECATED @18 :List(UInt16);
  recoverStateDEPRECATED @19 :Int32;
  highConversionGain @20 :Bool;
  measuredGreyFraction @21 :Float32;
  targetGreyFraction @22 :Float32;
  processingTime @23 :Float32;
  temperaturesC @24 :List(Float32);
  frameIdSensor @25 :UInt32;
  sensor @26 :UInt16;  # an enum in cereal (unknown, ar0231, ox03c10, os04c10): 16 bits
  exposureValPercent @27 :Float32;
  requestId @28 :UInt32;
}

# Where an encoded video frame sits: its camera frame and its index in the segment's file.
struct EncodeIndex {
  frameId @0 :UInt32;
  type @1 :UInt16;  # an enum in cereal whose members differ between versions: not interpreted
  encodeId @2 :UInt32;
  segmentNum @3 :Int32;
  segmentId @4 :UInt32;  # the frame's index in this segment's video file
  segmentIdEncode @5 :UInt32;
  timestampSof @6 :UInt64;
  timestampEof @7 :UInt64;
  flags @8 :UInt32;
  len @9 :UInt32;
}

# Ours, in the first member cereal reserves for forks: what the JSON message adds to
# driverStateV2, for every published message (a stalled camera's status too, which has no frame).
struct DmsStatus {
  frameId @0 :Int64;  # -1: no frame (the camera stalled)
  seq @1 :UInt64;
  runId @2 :Text;
  timestampSof @3 :UInt64;  # ns, the service's clock (0 without a frame)
  timestampEof @4 :UInt64;
  replayed @5 :Bool;  # the recorded timestamps below are set
  recordedTimestampSof @6 :UInt64;  # ns, a replayed frame's times as recorded
  recordedTimestampEof @7 :UInt64;
  frameAge @8 :Float64;  # seconds from start of frame to publication
  availability @9 :Availability;
  reason @10 :Text;  # empty when there is none
  reasonKind @11 :Text;  # empty when there is none
  readiness @12 :Readiness;
  valid @13 :Bool;  # the JSON message's valid: stricter than Event.valid
  late @14 :Bool;  # a valid frame published after its deadline (start of frame + budget)
  availabilityReason @15 :Text;  # why the service is not available (empty while it is)
  availabilityReasonKind @16 :Text;

  enum Availability {
    available @0;
    degraded @1;
    unavailable @2;
  }

  struct Readiness {
    deviceOnline @0 :Bool;
    firmwareReady @1 :Bool;
    queueSubmittable @2 :Bool;
    taskComplete @3 :Bool;
    outputValid @4 :Bool;
  }
}
