//! slotgate's gateway: slot-aware scheduling of OpenAI requests over engines.
//! Not written yet; see the open issues.
